"""Eight more plain-PyTorch networks, none of them among the ten of `tests/torchnets.py`.

A held-out check of issue 15's pricing: dlsim's CPU model (host time per operator, fresh pages, cache
regime, optimizer step) was built while looking at the ten; these networks were written afterwards,
from the papers they follow, to see whether it carries over. Each is what a user would write today:
ConvNeXt, a Llama-style decoder, MLP-Mixer, an EfficientNet-style block stack, a bidirectional GRU
classifier, WaveNet-style gated dilated convolutions, DenseNet-style concatenation, and a pre-norm
encoder with hand-written attention. `NETWORKS` has the same layout as
`benchmarks/validate_torch_nets.py`'s: (class, per-sample input shape, token input, vocabulary, batch).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvNeXtBlock(nn.Module):
    """Liu et al. 2022 (Fig. 4): 7x7 depthwise convolution, LayerNorm over channels, 4x inverted MLP
    with GELU, layer scale, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.gamma * self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class ChannelsLayerNorm(nn.Module):
    """LayerNorm over the channel dimension of an NCHW tensor."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dims=(32, 64), depths=(2, 2), classes: int = 10):
        super().__init__()
        layers = [nn.Conv2d(3, dims[0], 4, stride=4), ChannelsLayerNorm(dims[0])]
        for i, (dim, depth) in enumerate(zip(dims, depths)):
            if i:
                layers += [ChannelsLayerNorm(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, stride=2)]
            layers += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1])
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x):
        return self.head(self.norm(self.features(x).mean(dim=(2, 3))))


class RMSNorm(nn.Module):
    """Zhang & Sennrich 2019: x / sqrt(mean(x^2) + eps) * g."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    """Rotary position embedding (Su et al. 2021), the half-split form."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    """Touvron et al. 2023: pre-norm RMSNorm, rotary attention without biases, SwiGLU MLP."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.mlp_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.attn_norm(x)
        q, k, v = (w(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 128, heads: int = 4, layers: int = 2, context: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LlamaBlock(dim, heads, 2 * 4 * dim // 3) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        half = dim // heads // 2
        freqs = 1.0 / 10000 ** (torch.arange(half) / half)
        angles = torch.outer(torch.arange(context).float(), freqs)
        self.register_buffer("cos", torch.cat((angles.cos(), angles.cos()), -1), persistent=False)
        self.register_buffer("sin", torch.cat((angles.sin(), angles.sin()), -1), persistent=False)

    def forward(self, idx):
        x = self.embed(idx)
        t = idx.shape[1]
        for block in self.blocks:
            x = block(x, self.cos[:t], self.sin[:t])
        return self.out(self.norm(x))


class MixerBlock(nn.Module):
    """Tolstikhin et al. 2021: token-mixing MLP across patches (on the transpose), channel-mixing MLP."""

    def __init__(self, patches: int, dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.tokens = nn.Sequential(nn.Linear(patches, 2 * patches), nn.GELU(), nn.Linear(2 * patches, patches))
        self.norm2 = nn.LayerNorm(dim)
        self.channels = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self, patch: int = 4, dim: int = 64, depth: int = 4, classes: int = 10, image: int = 32):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, patch, stride=patch)
        self.blocks = nn.Sequential(*[MixerBlock((image // patch) ** 2, dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


class MBConv(nn.Module):
    """EfficientNet block (Tan & Le 2019): 1x1 expansion, depthwise 3x3, squeeze-and-excitation
    (Hu et al. 2018), SiLU, 1x1 projection."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4):
        super().__init__()
        mid = cin * expand
        self.residual = stride == 1 and cin == cout
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU())
        self.depthwise = nn.Sequential(nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid),
                                       nn.SiLU())
        self.squeeze = nn.Conv2d(mid, max(1, cin // 4), 1)
        self.excite = nn.Conv2d(max(1, cin // 4), mid, 1)
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.depthwise(self.expand(x))
        s = torch.sigmoid(self.excite(F.silu(self.squeeze(F.adaptive_avg_pool2d(y, 1)))))
        y = self.project(y * s)
        return x + y if self.residual else y


class EfficientNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.SiLU())
        self.blocks = nn.Sequential(MBConv(16, 16, 1), MBConv(16, 24, 2), MBConv(24, 24, 1), MBConv(24, 40, 2))
        self.head = nn.Linear(40, classes)

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


class BiGRUClassifier(nn.Module):
    """Token embedding, a two-layer bidirectional GRU (Cho et al. 2014), mean over time, linear head."""

    def __init__(self, vocab: int = 500, dim: int = 64, hidden: int = 64, classes: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, idx):
        out, _ = self.gru(self.embed(idx))
        return self.head(out.mean(dim=1))


class GatedResidual(nn.Module):
    """WaveNet layer (van den Oord et al. 2016): dilated causal convolution, tanh x sigmoid gate,
    1x1 residual and skip outputs."""

    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.pad = dilation
        self.conv = nn.Conv1d(channels, 2 * channels, 2, dilation=dilation)
        self.res = nn.Conv1d(channels, channels, 1)
        self.skip = nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        f, g = self.conv(F.pad(x, (self.pad, 0))).chunk(2, dim=1)
        z = torch.tanh(f) * torch.sigmoid(g)
        return x + self.res(z), self.skip(z)


class WaveNet(nn.Module):
    def __init__(self, channels: int = 32, dilations=(1, 2, 4, 8, 16, 32), classes: int = 10):
        super().__init__()
        self.inp = nn.Conv1d(1, channels, 1)
        self.layers = nn.ModuleList(GatedResidual(channels, d) for d in dilations)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.inp(x)
        skips = 0
        for layer in self.layers:
            x, s = layer(x)
            skips = skips + s
        return self.head(F.relu(skips).mean(dim=2))


class DenseLayer(nn.Module):
    """DenseNet-BC layer (Huang et al. 2017): BN, ReLU, 1x1 bottleneck, BN, ReLU, 3x3, concatenated."""

    def __init__(self, cin: int, growth: int):
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, 4 * growth, 1, bias=False),
                                  nn.BatchNorm2d(4 * growth), nn.ReLU(), nn.Conv2d(4 * growth, growth, 3, 1, 1, bias=False))

    def forward(self, x):
        return torch.cat([x, self.body(x)], dim=1)


class DenseNet(nn.Module):
    def __init__(self, growth: int = 12, classes: int = 10):
        super().__init__()
        c = 2 * growth
        layers: list[nn.Module] = [nn.Conv2d(3, c, 3, 1, 1, bias=False)]
        for block in range(2):
            for _ in range(4):
                layers.append(DenseLayer(c, growth))
                c += growth
            if block == 0:
                layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2)]
                c //= 2
        self.features = nn.Sequential(*layers, nn.BatchNorm2d(c), nn.ReLU())
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class ManualAttentionBlock(nn.Module):
    """Pre-norm encoder layer (Xiong et al. 2020) with attention written out: softmax(QK^T / sqrt(d) + mask) V."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.1)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, pad):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        weights = self.drop(scores.masked_fill(pad, float("-inf")).softmax(dim=-1))
        x = x + self.proj((weights @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class ManualEncoder(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 3, classes: int = 10, length: int = 32):
        super().__init__()
        self.inp = nn.Linear(16, dim)
        self.pos = nn.Parameter(torch.zeros(1, length, dim))
        self.blocks = nn.ModuleList(ManualAttentionBlock(dim, heads) for _ in range(layers))
        self.register_buffer("pad", torch.arange(length) >= length - 4, persistent=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.inp(x) + self.pos
        for block in self.blocks:
            x = block(x, self.pad)
        return self.head(x.mean(dim=1))


# name: (class, per-sample input shape, token input, vocabulary, batch)
NETWORKS = {
    "convnext": ("ConvNeXt", [3, 32, 32], False, 2, 32),
    "llama": ("Llama", [32], True, 256, 16),
    "mixer": ("MLPMixer", [3, 32, 32], False, 2, 32),
    "efficientnet": ("EfficientNet", [3, 32, 32], False, 2, 32),
    "bigru": ("BiGRUClassifier", [24], True, 500, 32),
    "wavenet": ("WaveNet", [1, 1024], False, 2, 16),
    "densenet": ("DenseNet", [3, 32, 32], False, 2, 32),
    "manual_encoder": ("ManualEncoder", [32, 16], False, 2, 64),
}
