"""Independent float64 NumPy formulations of the KernelBench matmul workloads.

These are written directly from JAXBench's workloads specification (workloads.md,
section 3 "KernelBench tier" and section 7), not from the project's JAX code, so
that they can serve as an independent check of the JAX references.

Covered: the 25 non-convolution KernelBench workloads (19k-50k without the
conv ones). Each function is named by the workload's snake name, takes the
workload ``config`` dict (section 6 key names) followed by the inputs in the
order of the workload's ``create_inputs``, and returns a float64 array of the
spec's output shape. Every input is cast to float64 first and all math stays in
float64. Variances are biased; ``gelu`` is the tanh approximation.

Weight layouts follow the spec's math: ``x @ W`` means W is stored (in, out),
``x @ W.T`` means W is stored (out, in).
"""

import numpy as np

# ---------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------


def _f64(*arrays):
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def relu(v):
    return np.maximum(v, 0.0)


def softplus(v):
    return np.logaddexp(0.0, v)


def sigmoid(v):
    # 1 / (1 + e^-v) == exp(-log(1 + e^-v)), stable for all v.
    return np.exp(-np.logaddexp(0.0, -v))


def swish(v):
    return v * sigmoid(v)


def mish(v):
    return v * np.tanh(softplus(v))


def gelu(v):
    """jax.nn.gelu default: the tanh approximation."""
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v**3)))


def logsumexp(v, axis, keepdims=False):
    m = np.max(v, axis=axis, keepdims=True)
    out = m + np.log(np.sum(np.exp(v - m), axis=axis, keepdims=True))
    return out if keepdims else np.squeeze(out, axis=axis)


def softmax(v, axis):
    e = np.exp(v - np.max(v, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def group_norm(v, groups, eps, weight, bias):
    """GroupNorm over the feature axis of a (rows, features) array."""
    rows, features = v.shape
    assert features % groups == 0, (features, groups)
    g = v.reshape(rows, groups, features // groups)
    mean = g.mean(axis=-1, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=-1, keepdims=True)
    g = (g - mean) / np.sqrt(var + eps)
    return g.reshape(rows, features) * weight + bias


# ---------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------


def matmul_subtract_multiply_relu(config, x, w, b):
    """19k: relu(((x@W + b) - subtract_value) * multiply_value)."""
    x, w, b = _f64(x, w, b)
    v = x @ w + b
    return relu((v - config["subtract_value"]) * config["multiply_value"])


def gemm_multiply_leakyrelu(config, x, w, b):
    """20k: v = multiplier*(x@W + b); leaky relu with negative_slope."""
    x, w, b = _f64(x, w, b)
    v = config["multiplier"] * (x @ w + b)
    return np.where(v >= 0, v, config["negative_slope"] * v)


def gemm_divide_sum_scaling(config, x, w):
    """21k: scaling_factor * sum_j (x@W^T)[i, j] / 2, keepdims -> (M, 1)."""
    x, w = _f64(x, w)
    v = (x @ w.T) / 2.0
    return config["scaling_factor"] * np.sum(v, axis=1, keepdims=True)


def matmul_sum_max_avgpool_logsumexp_logsumexp(config, x, w, b):
    """23k: s = rowsum(x@W^T + b) keepdims; then max, mean, lse, lse over axis 1."""
    x, w, b = _f64(x, w, b)
    s = np.sum(x @ w.T + b, axis=1, keepdims=True)
    s = np.max(s, axis=1, keepdims=True)
    s = np.mean(s, axis=1, keepdims=True)
    s = logsumexp(s, axis=1, keepdims=True)
    s = logsumexp(s, axis=1, keepdims=True)
    return s


def matmul_scale_residualadd_clamp_logsumexp_mish(config, x, w, b):
    """24k: v = scale*(x@W^T + b); v = v + v; clip; l = lse keepdims; l*mish(l)."""
    x, w, b = _f64(x, w, b)
    v = config["scale_factor"] * (x @ w.T + b)
    v = v + v
    v = np.clip(v, config["clamp_min"], config["clamp_max"])
    ell = logsumexp(v, axis=1, keepdims=True)
    return ell * mish(ell)


def bmm_instancenorm_sum_residualadd_multiply(config, x, y, w, b, in_weight, in_bias):
    """26k: v = x@W^T + b; InstanceNorm2d on (M, N, 1, 1); (v' + y) * y."""
    x, y, w, b, in_weight, in_bias = _f64(x, y, w, b, in_weight, in_bias)
    v = (x @ w.T + b)[:, :, None, None]
    mean = v.mean(axis=(2, 3), keepdims=True)
    var = ((v - mean) ** 2).mean(axis=(2, 3), keepdims=True)
    v = (v - mean) / np.sqrt(var + 1e-5)
    v = v[:, :, 0, 0] * in_weight + in_bias
    return (v + y) * y


def matmul_mish_mish(config, x, w, b):
    """27k: mish(mish(x@W + b))."""
    x, w, b = _f64(x, w, b)
    return mish(mish(x @ w + b))


def matmul_swish_sum_groupnorm(config, x, w, b, gn_weight, gn_bias):
    """29k: v = swish(x@W) + b; GroupNorm(num_groups, eps 1e-5)."""
    x, w, b, gn_weight, gn_bias = _f64(x, w, b, gn_weight, gn_bias)
    v = swish(x @ w) + b
    return group_norm(v, config["num_groups"], 1e-5, gn_weight, gn_bias)


def matmul_scaling_residualadd(config, x, w, b):
    """30k: v = x@W + b; scaling_factor*v + v."""
    x, w, b = _f64(x, w, b)
    v = x @ w + b
    return config["scaling_factor"] * v + v


def gemm_batchnorm_gelu_relu(config, x, w, b, bn_weight, bn_bias):
    """31k: v = x@W^T + b; training-mode BatchNorm1d (eps 1e-5); gelu; relu."""
    x, w, b, bn_weight, bn_bias = _f64(x, w, b, bn_weight, bn_bias)
    v = x @ w.T + b
    mean = v.mean(axis=0, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=0, keepdims=True)
    v = (v - mean) / np.sqrt(var + 1e-5) * bn_weight + bn_bias
    return relu(gelu(v))


def gemm_sigmoid_logsumexp(config, x, w1, b1, w2, b2):
    """32k: h = sigmoid(x@W1^T + b1); z = h@W2^T + b2; lse over axis 1 -> (M,)."""
    x, w1, b1, w2, b2 = _f64(x, w1, b1, w2, b2)
    h = sigmoid(x @ w1.T + b1)
    z = h @ w2.T + b2
    return logsumexp(z, axis=1)


def gemm_scaling_hardtanh_gelu(config, x, w, b):
    """35k: gelu(clip(scaling_factor*(x@W + b), hardtanh_min, hardtanh_max))."""
    x, w, b = _f64(x, w, b)
    v = config["scaling_factor"] * (x @ w + b)
    v = np.clip(v, config["hardtanh_min"], config["hardtanh_max"])
    return gelu(v)


def matmul_sigmoid_sum(config, x, w, b):
    """36k: sum_j sigmoid(x@W + b), keepdims -> (M, 1)."""
    x, w, b = _f64(x, w, b)
    return np.sum(sigmoid(x @ w + b), axis=1, keepdims=True)


def matmul_swish_scaling(config, x, w, b):
    """37k: scaling_factor * swish(x@W + b)."""
    x, w, b = _f64(x, w, b)
    return config["scaling_factor"] * swish(x @ w + b)


def matmul_dropout_softmax(config, x, w, b):
    """38k: softmax(x@W^T + b, axis 1); dropout is the identity (eval mode)."""
    x, w, b = _f64(x, w, b)
    return softmax(x @ w.T + b, axis=1)


def gemm_groupnorm_min_biasadd(config, x, w, lin_b, gn_weight, gn_bias, bias):
    """40k: GroupNorm(x@W^T + b); row-min -> (1, 1, M, 1); + bias -> (1, N, M, 1)."""
    x, w, lin_b, gn_weight, gn_bias, bias = _f64(x, w, lin_b, gn_weight, gn_bias, bias)
    v = group_norm(x @ w.T + lin_b, config["num_groups"], 1e-5, gn_weight, gn_bias)
    m = np.min(v, axis=1, keepdims=True)  # (M, 1)
    m = m.reshape(1, 1, m.shape[0], 1)
    return m + bias  # bias (1, N, 1, 1)


def gemm_add_relu(config, x, w, b):
    """41k: relu(x@W + b)."""
    x, w, b = _f64(x, w, b)
    return relu(x @ w + b)


def gemm_max_subtract_gelu(config, x, w, b):
    """42k: v = x@W + b; gelu(v - rowmax(v)), row max keepdims over max_dim."""
    x, w, b = _f64(x, w, b)
    v = x @ w + b
    return gelu(v - np.max(v, axis=config["max_dim"], keepdims=True))


def gemm_batchnorm_scaling_softmax(config, x, w, b, bn_scale, bn_bias, bn_mean, bn_var, scale):
    """43k: eval-mode BatchNorm(x@W + b) with bn_eps; * scale; softmax axis 1."""
    x, w, b, bn_scale, bn_bias, bn_mean, bn_var, scale = _f64(
        x, w, b, bn_scale, bn_bias, bn_mean, bn_var, scale
    )
    v = x @ w + b
    v = (v - bn_mean) / np.sqrt(bn_var + config["bn_eps"]) * bn_scale + bn_bias
    return softmax(scale * v, axis=1)


def matmul_divide_gelu(config, x, w, b):
    """44k: gelu((x@W + b) / divisor)."""
    x, w, b = _f64(x, w, b)
    return gelu((x @ w + b) / config["divisor"])


def gemm_groupnorm_swish_multiply_swish(config, x, w, b, gn_weight, gn_bias, multiply_weight):
    """45k: GroupNorm(x@W^T + b); swish; * multiply_weight; swish."""
    x, w, b, gn_weight, gn_bias, multiply_weight = _f64(
        x, w, b, gn_weight, gn_bias, multiply_weight
    )
    v = group_norm(x @ w.T + b, config["num_groups"], 1e-5, gn_weight, gn_bias)
    return swish(swish(v) * multiply_weight)


def matmul_add_swish_tanh_gelu_hardtanh(config, x, w, b, add_value):
    """47k: clip(gelu(tanh(swish(x@W + b + add_value))), -1, 1)."""
    x, w, b, add_value = _f64(x, w, b, add_value)
    v = swish(x @ w + b + add_value)
    return np.clip(gelu(np.tanh(v)), -1.0, 1.0)


def matmul_batchnorm_biasadd_divide_swish(
    config, x, w, lin_b, bn_scale, bn_bias, bn_mean, bn_var, bias
):
    """48k: eval-mode BatchNorm(x@W + b) with bn_eps; + bias; / divide_value; swish."""
    x, w, lin_b, bn_scale, bn_bias, bn_mean, bn_var, bias = _f64(
        x, w, lin_b, bn_scale, bn_bias, bn_mean, bn_var, bias
    )
    v = x @ w + lin_b
    v = (v - bn_mean) / np.sqrt(bn_var + config["bn_eps"]) * bn_scale + bn_bias
    v = (v + bias) / config["divide_value"]
    return swish(v)


def matmul_avgpool_gelu_scale_max(config, x, w, b):
    """49k: AvgPool1d(x@W + b, kernel = stride = pool_kernel_size); gelu; * scale; max."""
    x, w, b = _f64(x, w, b)
    v = x @ w + b
    k = config["pool_kernel_size"]
    n_out = v.shape[1] // k  # AvgPool1d default (floor) drops a trailing remainder
    v = v[:, : n_out * k].reshape(v.shape[0], n_out, k).mean(axis=2)
    v = gelu(v) * config["scale_factor"]
    return np.max(v, axis=1)


def matmul_gelu_softmax(config, x, w, b):
    """50k: softmax(gelu(x@W + b), axis 1)."""
    x, w, b = _f64(x, w, b)
    return softmax(gelu(x @ w + b), axis=1)


FORMULATIONS = {
    "matmul_subtract_multiply_relu": matmul_subtract_multiply_relu,
    "gemm_multiply_leakyrelu": gemm_multiply_leakyrelu,
    "gemm_divide_sum_scaling": gemm_divide_sum_scaling,
    "matmul_sum_max_avgpool_logsumexp_logsumexp": matmul_sum_max_avgpool_logsumexp_logsumexp,
    "matmul_scale_residualadd_clamp_logsumexp_mish": matmul_scale_residualadd_clamp_logsumexp_mish,
    "bmm_instancenorm_sum_residualadd_multiply": bmm_instancenorm_sum_residualadd_multiply,
    "matmul_mish_mish": matmul_mish_mish,
    "matmul_swish_sum_groupnorm": matmul_swish_sum_groupnorm,
    "matmul_scaling_residualadd": matmul_scaling_residualadd,
    "gemm_batchnorm_gelu_relu": gemm_batchnorm_gelu_relu,
    "gemm_sigmoid_logsumexp": gemm_sigmoid_logsumexp,
    "gemm_scaling_hardtanh_gelu": gemm_scaling_hardtanh_gelu,
    "matmul_sigmoid_sum": matmul_sigmoid_sum,
    "matmul_swish_scaling": matmul_swish_scaling,
    "matmul_dropout_softmax": matmul_dropout_softmax,
    "gemm_groupnorm_min_biasadd": gemm_groupnorm_min_biasadd,
    "gemm_add_relu": gemm_add_relu,
    "gemm_max_subtract_gelu": gemm_max_subtract_gelu,
    "gemm_batchnorm_scaling_softmax": gemm_batchnorm_scaling_softmax,
    "matmul_divide_gelu": matmul_divide_gelu,
    "gemm_groupnorm_swish_multiply_swish": gemm_groupnorm_swish_multiply_swish,
    "matmul_add_swish_tanh_gelu_hardtanh": matmul_add_swish_tanh_gelu_hardtanh,
    "matmul_batchnorm_biasadd_divide_swish": matmul_batchnorm_biasadd_divide_swish,
    "matmul_avgpool_gelu_scale_max": matmul_avgpool_gelu_scale_max,
    "matmul_gelu_softmax": matmul_gelu_softmax,
}
