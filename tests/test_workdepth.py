"""Work-depth formulas against the survey's hand-computed cases (Ben-Nun & Hoefler 2018)."""

from dlsim.cost.workdepth import (clog2, conv_direct_depth, conv_direct_work, conv_im2col_depth, fc_depths, fc_work,
                                  pool_depth, pool_work_survey)


def test_lenet5_inference_work_and_depth_as_the_survey_counts_them():
    """S002 L376-386: W = 665,832 and D = 41 for LeNet-5 inference of one image.

    The survey's example mixes conventions (seeds-inventory §1.6): conv1 uses its 28x28 output, conv2
    its 14x14 input; pooling is (K²-1)·H²·C of the input; conv1's depth is the im2col reduction depth
    ⌈log2 25⌉ = 5 while conv2's is the direct depth ⌈log2 6⌉ + 2⌈log2 5⌉ = 9; FC depth is ⌈log2 C_in⌉.
    """
    works = [
        conv_direct_work(1, 6, 28, 28, 1, 5, 5),     # W_conv(32, 5, 1, 6)
        pool_work_survey(28, 2, 6),                  # W_pool(28, 2, 6)
        conv_direct_work(1, 16, 14, 14, 6, 5, 5),    # W_conv(14, 5, 6, 16), input size as the survey uses
        pool_work_survey(10, 2, 16),                 # W_pool(10, 2, 16)
        fc_work(1, 400, 120), fc_work(1, 120, 84), fc_work(1, 84, 10),
    ]
    assert works == [117_600, 14_112, 470_400, 4_800, 48_000, 10_080, 840]
    assert sum(works) == 665_832
    depths = [conv_im2col_depth(1, 5, 5), pool_depth(2, 2), conv_direct_depth(6, 5, 5), pool_depth(2, 2),
              fc_depths(1, 400, 120)[0], fc_depths(1, 120, 84)[0], fc_depths(1, 84, 10)[0]]
    assert depths == [5, 2, 9, 2, 9, 7, 7]
    assert sum(depths) == 41


def test_clog2():
    assert [clog2(n) for n in (1, 2, 3, 4, 5, 1024, 1025)] == [0, 1, 2, 2, 3, 10, 11]


def test_fc_depths_follow_table4():
    # Table 4: y O(log C_in), ∇x O(log C_out), ∇w O(log N)
    assert fc_depths(256, 4096, 1000) == (12, 10, 8)
