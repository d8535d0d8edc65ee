"""Every op that registers a gradient has it checked against finite differences somewhere.

The table-driven tests list their cases; this test builds each case's graph and collects the
op types it exercises, so a new differentiable op without a gradient row fails here.
"""
import numpy as np

import isthmus as ism
from isthmus.core import registry

from . import test_array_ops, test_conv_ops, test_math_ops, test_nn_ops, test_reduce_ops
from . import test_activation_ops, test_conv_transpose_quant_ops, test_einsum_ops, test_indexing_ops  # issue 20
from . import test_det_ops

ADDED_FAMILIES = (test_activation_ops, test_indexing_ops, test_conv_transpose_quant_ops, test_einsum_ops, test_det_ops)  # CASES rows: (name, build, inputs, ref, differentiable)

# ops whose gradients are checked by dedicated tests rather than by the tables above
CHECKED_ELSEWHERE = {
    "If": "test_control_flow.test_cond_gradient",
    "While": "test_control_flow.test_while_gradient_matches_finite_differences",
    "SetRow": "test_rnn.test_lstm_gradient_matches_finite_differences",
    "Gather": "test_control_flow (rnn bodies gather rows) and test_layers (embedding)",
    "Dropout": "test_nn_ops.test_dropout_masks_and_scales_and_its_gradient_uses_the_mask",
    "Identity": "passes through dy unchanged",
    "DeviceCopy": "passes through dy unchanged (core/ops/device_copy.py)",
    "AttentionBias": "returns no gradient by definition (masks); attention's is test_attention_ops",
    "CheckNumerics": "test_numerics.test_check_numerics_op_passes_values_through_and_names_itself_on_nan",
    "StopGradient": "returns no gradient by definition",
    "OnesLike": "returns no gradient by definition", "ZerosLike": "returns no gradient by definition",
    "ReshapeTo": "test_array_ops.test_reshape_to_a_run_time_shape",
    "SplitSizes": "test_array_ops.test_split_by_run_time_sizes",
    "SliceDynamic": "test_array_ops.test_run_time_slices_and_axes",
    "SqueezeDynamic": "test_array_ops.test_run_time_slices_and_axes",
    "ExpandDynamic": "test_array_ops.test_run_time_slices_and_axes",
    "Cast": "test_math_ops.test_cast_gradient (analytic: float32 differences are too coarse)",
    "Resize": "test_image_ops.test_resize_forward_and_gradient",
    "LSTMStep": "test_recurrent_ops.test_lstm_step_forward_and_gradient",
    "GRUStep": "test_recurrent_ops.test_gru_step_forward_and_gradient",
    "FusedConv2DAdd": "test_conv_residual.test_fused_conv_add_gradient_matches_finite_differences",
}


def _ops_of(build, inputs):
    g = ism.Graph()
    with g.as_default():
        phs = [ism.placeholder(np.asarray(a).dtype, np.asarray(a).shape) for a in inputs]
        build(*phs)
    return {n.op for n in g.nodes}


def test_every_differentiable_op_has_a_gradient_check():
    seen = set()
    for case in test_math_ops.FLOAT_CASES:
        if case[4]:
            seen |= _ops_of(case[1], case[2])
    for case in list(test_array_ops.CASES) + list(test_nn_ops.CASES):
        if len(case) < 5 or case[4]:  # (name, build, inputs, reference[, differentiable])
            seen |= _ops_of(case[1], case[2])
    for _, build, _ in test_reduce_ops.CASES:
        seen |= _ops_of(build, [test_reduce_ops.X])
    for _, kw, wshape, _ in test_conv_ops.CONV_CASES:
        seen |= _ops_of(lambda x, w: ism.conv2d(x, w, **kw), [np.zeros((1, 4, 5, 4)), np.zeros(wshape)])
    for _, fn, kw, *_ in test_conv_ops.POOL_CASES:
        seen |= _ops_of(lambda x: fn(x, **kw), [np.zeros((2, 3, 6, 6))])
    seen |= _ops_of(ism.global_avg_pool, [np.zeros((2, 3, 4, 5))])
    for family in ADDED_FAMILIES:
        for case in family.CASES:
            if case[4]:
                seen |= _ops_of(case[1], case[2])
    with_grad = {name for name in registry.registered() if registry.get(name).grad is not None}
    # ops made only by gradients or passes, or whose "gradient" is None by definition
    derived = {n for n in with_grad if n.endswith("Grad") or n in ("ReduceSumLike", "BroadcastLike", "ExpandAxes",
                                                                  "ReshapeLike", "MergeLeading", "DenseFromSlices")}
    missing = sorted(with_grad - seen - set(CHECKED_ELSEWHERE) - derived - _no_gradient_by_definition())
    assert not missing, f"differentiable ops with no finite-difference check: {missing}"


def _no_gradient_by_definition():
    """Ops whose registered gradient always returns None (comparisons, argmax, shapes, ints)."""
    return {"Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr",
            "LogicalNot", "Sign", "Floor", "Ceil", "ArgMax", "ArgMin", "Shape", "Fill", "OneHot"}.union(
        *(family.NO_GRADIENT for family in ADDED_FAMILIES))

