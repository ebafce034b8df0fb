"""Ten ordinary networks in plain PyTorch, small enough for tests, as their users write them.

Each entry of `NETWORKS` builds (module, example input batch). `Branchy` takes a data-dependent branch
(which no tracer can capture). The networks are written here from the papers they follow; nothing
is imported from torchvision.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2


class InvertedResidual(nn.Module):
    """MobileNetV2 block (Sandler et al. 2018, Table 1): 1x1 expand, 3x3 depthwise, 1x1 linear projection."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        mid = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.conv = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(inplace=True))
        cfg = [(16, 16, 1, 1), (16, 24, 2, 6), (24, 24, 1, 6), (24, 32, 2, 6), (32, 32, 1, 6)]
        self.features = nn.Sequential(*[InvertedResidual(*c) for c in cfg])
        self.head = nn.Sequential(nn.Conv2d(32, 128, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU6(inplace=True))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(128, classes))

    def forward(self, x):
        x = self.head(self.features(self.stem(x)))
        return self.classifier(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


class BasicBlock(nn.Module):
    """ResNet basic block (He et al. 2016), torchvision layout: projection shortcut where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, depths=(2, 2, 2, 2), widths=(16, 32, 64, 128), classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = widths[0]
        for i, (d, w) in enumerate(zip(depths, widths)):
            blocks = [BasicBlock(cin, w, 1 if i == 0 else 2)] + [BasicBlock(w, w, 1) for _ in range(d - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            cin = w
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class ViT(nn.Module):
    """Vision transformer (Dosovitskiy et al. 2021): patches, class token, learned positions, pre-norm encoder."""

    def __init__(self, image: int = 32, patch: int = 4, dim: int = 64, depth: int = 2, heads: int = 4,
                 classes: int = 10):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        tokens = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.encoder(x))
        return self.head(x[:, 0])


class AttentionNet(nn.Module):
    """A hand-written causal self-attention (F.scaled_dot_product_attention) followed by nn.MultiheadAttention."""

    def __init__(self, dim: int = 32, heads: int = 4, classes: int = 5):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, classes)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, d))
        h = self.norm2(x)
        a, _ = self.mha(h, h, h, need_weights=False)
        return self.out((x + a).mean(dim=1))


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int = 100, dim: int = 32, hidden: int = 64, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, layers, batch_first=True)
        self.drop = nn.Dropout(0.1)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.decoder(self.drop(out))


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim),
                                 nn.Dropout(0.1))

    def forward(self, x):
        b, t, d = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2-style decoder (Radford et al. 2019) with the output projection tied to the token embedding."""

    def __init__(self, vocab: int = 128, context: int = 16, dim: int = 64, depth: int = 2, heads: int = 4):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList([GPTBlock(dim, heads) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm1 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout)

    def forward(self, x):
        x = F.silu(self.norm1(self.conv1(x)))
        return F.silu(self.norm2(self.conv2(x)))


class UNet(nn.Module):
    """U-Net (Ronneberger et al. 2015), two levels, GroupNorm and transposed-convolution upsampling."""

    def __init__(self, cin: int = 3, base: int = 16, classes: int = 2):
        super().__init__()
        self.down1 = ConvBlock(cin, base)
        self.down2 = ConvBlock(base, 2 * base)
        self.bottom = ConvBlock(2 * base, 4 * base)
        self.up2 = nn.ConvTranspose2d(4 * base, 2 * base, 2, stride=2)
        self.dec2 = ConvBlock(4 * base, 2 * base)
        self.up1 = nn.ConvTranspose2d(2 * base, base, 2, stride=2)
        self.dec1 = ConvBlock(2 * base, base)
        self.out = nn.Conv2d(base, classes, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        b = self.bottom(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return self.out(u1)


class TensorOps(nn.Module):
    """permute / transpose / view / mean / matmul / einsum / chunk as people write them inline."""

    def __init__(self, dim: int = 32, classes: int = 4):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, 2 * dim) / math.sqrt(dim))
        self.mix = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, classes)

    def forward(self, x):                      # (B, L, D)
        a, b = (x @ self.w).chunk(2, dim=-1)
        scores = torch.einsum("bld,bmd->blm", a, b) / math.sqrt(a.shape[-1])
        y = torch.matmul(scores.softmax(dim=-1), b)
        y = y.permute(0, 2, 1).contiguous().view(x.shape[0], x.shape[2], -1)   # (B, D, L)
        y = self.mix(y.transpose(1, 2))        # (B, L, D)
        return self.out(torch.tanh(y).mean(dim=1))


class WideMLP(nn.Module):
    def __init__(self, features: int = 256, width: int = 1024, classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(features, width), nn.ReLU(), nn.Linear(width, width),
                                 nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, classes))

    def forward(self, x):
        return self.net(x)


class AudioNet(nn.Module):
    """A 1-D convolutional keyword spotter over raw audio (M5-style, Dai et al. 2017)."""

    def __init__(self, classes: int = 8):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 16, 15, stride=4, padding=7), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(16, 32, 5, padding=2), nn.BatchNorm1d(32), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(32, 64, 3, padding=1), nn.BatchNorm1d(64), nn.ReLU())
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=-1))


class Branchy(nn.Module):
    """Data-dependent control flow: the branch taken depends on the values, not the shapes."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return self.fc(-x)


def _tokens(vocab: int, length: int):
    return lambda: torch.randint(0, vocab, (BATCH, length))


def _floats(*shape: int):
    return lambda: torch.randn(BATCH, *shape)


NETWORKS = {
    "mobilenetv2": (MobileNetV2, _floats(3, 32, 32)),
    "resnet": (ResNet, _floats(3, 32, 32)),
    "vit": (ViT, _floats(3, 32, 32)),
    "attention": (AttentionNet, _floats(16, 32)),
    "lstm_lm": (LSTMLanguageModel, _tokens(100, 16)),
    "gpt": (GPT, _tokens(128, 16)),
    "unet": (UNet, _floats(3, 16, 16)),
    "tensor_ops": (TensorOps, _floats(8, 32)),
    "wide_mlp": (WideMLP, _floats(256)),
    "audio": (AudioNet, _floats(1, 512)),
}
"""name -> (factory, example input maker); the input is batch-first with batch `BATCH`."""


def build(name: str):
    """(module, example input) of network `name`, seeded."""
    torch.manual_seed(0)
    factory, example = NETWORKS[name]
    return factory(), example()


COUNT_TOLERANCE = 0.02
"""Issue 15, acceptance line 1: forward and backward FLOPs within 2% of PyTorch's counter."""


def assert_counts_match(model, net, x, tolerance: float = COUNT_TOLERANCE) -> None:
    """`model` (an import of `net`) has `net`'s parameters exactly and its forward and backward FLOPs on
    `x` within `tolerance` of PyTorch's counter (`counted_by_torch`)."""
    from dlsim.cost.counted import counted_flops

    assert model.params == sum(p.numel() for p in net.parameters())
    fwd, bwd = counted_flops(model, x.shape[0])
    want_fwd, want_bwd = counted_by_torch(net, x)
    assert want_fwd > 0 and want_bwd > 0
    assert abs(fwd - want_fwd) <= tolerance * want_fwd, (fwd, want_fwd)
    assert abs(bwd - want_bwd) <= tolerance * want_bwd, (bwd, want_bwd)


def counted_by_torch(net, x):
    """(forward, backward) FLOPs of one training step of `net` on `x` as PyTorch's counter counts them
    (`dlsim.importers.torch_meter.counter`, oneDNN off), the loss the mean square of the output."""
    from dlsim.importers.torch_meter import counter

    net.train()
    with torch.backends.mkldnn.flags(enabled=False):
        with counter() as fwd:
            out = net(x)
        loss = out.float().pow(2).mean()
        with counter() as bwd:
            loss.backward()
    return fwd.get_total_flops(), bwd.get_total_flops()


def export_onnx(net, x, path, **options) -> None:
    """`net` exported to ONNX at `path` as a user exports it for training: TorchScript exporter, training
    mode, no constant folding, input ``x`` with a dynamic batch (unless `options` say otherwise)."""
    import warnings

    kwargs = {"dynamo": False, "training": torch.onnx.TrainingMode.TRAINING, "do_constant_folding": False,
              "input_names": ["x"], "dynamic_axes": {"x": {0: "batch"}}, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), str(path), **kwargs)
