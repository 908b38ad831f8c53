"""The KernelBench matmul workloads: 19k-50k except the convolutions (workloads.md section 3).

Each class states its inputs, its JAX reference (the XLA baseline, in the input dtype as
JAXBench runs it) and its template part: the epilogue fused into the family's tiled
matmul (``matmul_family``). Linear layers follow the spec: ``x @ W`` for W stored
(in, out), ``x @ W.T`` for W stored (out, in), which the kernel reads without a transpose.

The check's seeds (never 0) draw every workload's inputs structured by the family's shared
rules (``matmul_family``, ``kernelbench``): x around U[0,1)'s mean with per-row and
per-column means and scales, correlated rows and outliers; weights with scales, low rank and
outliers; biases at ``kernelbench.BIAS_SCALE`` instead of 0.02; the spec's constant ones and
zeros (norm weights and biases, running statistics) drawn around 1 and 0.

Weak checks (workloads.md section 5) and what this suite does about them:

* 26k: InstanceNorm over a 1x1 extent makes the GEMM dead code; the output is
  (in_bias + y) * y exactly. It still depends on y and in_bias, so zero, constant and
  pass-through outputs fail; a kernel that skips the GEMM is correct, and fast.
* 38k, 43k, 50k: softmax over N columns puts almost every value below atol=1e-2, so a
  zero output used to pass. Their atol is 1e-2 / N (1% of a row's mean value); see
  ``SoftmaxTolerance``.
* 21k: the spec's 1e-1 tolerance let a constant output pass (the rows share a component
  some 40 times their spread); compared with the float32 reference, 1e-2 holds for
  correct kernels and rejects it.
* 32k: see its class (w2's scale).
* 21k and 23k reduce to a mat-vec (the row sum of x @ W.T is x . sum_j W_j), 47k's final
  clip is a no-op, 48k divides by 1.0: legitimate shortcuts, left in. The physical floor
  (``essential_work``) counts a shortcut's work where it saves HBM traffic or MXU FLOPs:
  21k and 23k's mat-vec, 49k's pool folded into W, 26k without its GEMM.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import kernelbench as kb
from .essential import io_bytes
from .base import Knob
from .matmul_family import FOLD, MatmulWorkload, Param, weight, x_param

EPS = 1e-5
SQUARE = {"batch_size": 4096, "in_features": 8192, "out_features": 8192}  # "as 19k"


# The glue of the workloads whose inputs are x, w (in, out), b and whose epilogue is all
# that differs.
BIAS_GLUE = """
    def workload(x, w, b):
        return fused_matmul(x, w, (row(b),), epilogue=epilogue, **tiling())
"""


def linear(x, w, b=None, transpose=False, precision=None):
    v = jnp.matmul(x, w.T if transpose else w, precision=precision)
    return v if b is None else v + b


def mish(v):
    return v * jnp.tanh(jax.nn.softplus(v))


def group_norm(v, groups, weight, bias, eps=EPS):
    """GroupNorm over groups of adjacent features; jnp.var's f32 accumulation (section 7)."""
    m, n = v.shape
    g = v.reshape(m, groups, n // groups)
    out = (g - g.mean(-1, keepdims=True)) / jnp.sqrt(g.var(-1, keepdims=True) + eps)
    return out.reshape(m, n) * weight + bias


def bias_params(*names, key=kb.KB, n="out_features"):
    return tuple(Param(name, (n,), "normal", key) for name in names)


def constant_params(init, *names, n="out_features"):
    return tuple(Param(name, (n,), init) for name in names)


STANDARD = (x_param(), weight(("in_features", "out_features"), "in_features"), *bias_params("b"))
STANDARD_T = (x_param(), weight(("out_features", "in_features"), "in_features"), *bias_params("b"))


def standard(key=kb.KB, transpose=False, m="batch_size", k="in_features", n="out_features"):
    """x, w, b: x ~ U[0,1) from key(0); w, b ~ N*0.02 from split(key, 2)."""
    shape = (n, k) if transpose else (k, n)
    return (x_param(m, k), weight(shape, k, key=key), *bias_params("b", key=key, n=n))


class SoftmaxTolerance:
    """atol = 1e-2 / N for outputs that are softmax rows: their mean value is 1/N, so the
    spec's atol=1e-2 accepted an all-zero output (section 5). rtol stays 1e-2."""

    def tolerance(self, config):
        return self.atol / config[self.n_key], self.rtol


# --- elementwise epilogues ----------------------------------------------------------


class MatmulSubtractMultiplyRelu(MatmulWorkload):
    name, jaxbench_id = "matmul_subtract_multiply_relu", "19k"
    description = "relu(((x@W + b) - 2) * 1.5)"
    defaults = {**SQUARE, "subtract_value": 2.0, "multiply_value": 1.5, "dtype": "bfloat16"}
    params = STANDARD

    def reference(self, config, x, w, b):
        return jax.nn.relu((linear(x, w, b) - config["subtract_value"]) * config["multiply_value"])

    template_part = """
    def epilogue(acc, b):
        return jnp.maximum((acc + b - CONFIG["subtract_value"]) * CONFIG["multiply_value"], 0.0)

    """ + BIAS_GLUE


class GemmMultiplyLeakyRelu(MatmulWorkload):
    name, jaxbench_id = "gemm_multiply_leakyrelu", "20k"
    description = "leaky_relu(2 * (x@W + b), 0.1)"
    defaults = {**SQUARE, "multiplier": 2.0, "negative_slope": 0.1, "dtype": "bfloat16"}
    params = STANDARD

    def reference(self, config, x, w, b):
        v = config["multiplier"] * linear(x, w, b)
        return jnp.where(v >= 0, v, config["negative_slope"] * v)

    template_part = """
    def epilogue(acc, b):
        v = CONFIG["multiplier"] * (acc + b)
        return jnp.where(v >= 0, v, CONFIG["negative_slope"] * v)

    """ + BIAS_GLUE


class MatmulMishMish(MatmulWorkload):
    name, jaxbench_id = "matmul_mish_mish", "27k"
    description = "mish(mish(x@W + b))"
    defaults = {**SQUARE, "dtype": "bfloat16"}
    params = STANDARD

    def reference(self, config, x, w, b):
        return mish(mish(linear(x, w, b)))

    template_part = """
    def epilogue(acc, b):
        return mish(mish(acc + b))

    """ + BIAS_GLUE


class MatmulScalingResidualAdd(MatmulWorkload):
    name, jaxbench_id = "matmul_scaling_residualadd", "30k"
    description = "v = x@W + b; v * 0.5 + v"
    defaults = {"batch_size": 16384, "in_features": 4096, "out_features": 4096, "scaling_factor": 0.5,
                "dtype": "bfloat16"}
    params = STANDARD

    def reference(self, config, x, w, b):
        v = linear(x, w, b)
        return v * config["scaling_factor"] + v

    template_part = """
    def epilogue(acc, b):
        v = acc + b
        return v * CONFIG["scaling_factor"] + v

    """ + BIAS_GLUE


class GemmScalingHardtanhGelu(MatmulWorkload):
    name, jaxbench_id = "gemm_scaling_hardtanh_gelu", "35k"
    description = "gelu(clip(0.5 * (x@W + b), -2, 2))"
    defaults = {**SQUARE, "scaling_factor": 0.5, "hardtanh_min": -2, "hardtanh_max": 2, "dtype": "bfloat16"}
    params = STANDARD

    def reference(self, config, x, w, b):
        v = jnp.clip(linear(x, w, b) * config["scaling_factor"], config["hardtanh_min"], config["hardtanh_max"])
        return 0.5 * v * (1.0 + jnp.tanh(jnp.sqrt(2.0 / jnp.pi) * (v + 0.044715 * jnp.power(v, 3))))

    template_part = """
    def epilogue(acc, b):
        return gelu(jnp.clip((acc + b) * CONFIG["scaling_factor"], CONFIG["hardtanh_min"], CONFIG["hardtanh_max"]))

    """ + BIAS_GLUE


class MatmulSwishScaling(MatmulWorkload):
    name, jaxbench_id = "matmul_swish_scaling", "37k"
    description = "2 * swish(x@W + b)"
    defaults = {**SQUARE, "scaling_factor": 2.0, "dtype": "bfloat16"}
    params = STANDARD

    def reference(self, config, x, w, b):
        return jax.nn.swish(linear(x, w, b)) * config["scaling_factor"]

    template_part = """
    def epilogue(acc, b):
        return swish(acc + b) * CONFIG["scaling_factor"]

    """ + BIAS_GLUE


class GemmAddRelu(MatmulWorkload):
    name, jaxbench_id = "gemm_add_relu", "41k"
    description = "relu(x@W + b)"
    defaults = {**SQUARE, "dtype": "bfloat16"}
    params = STANDARD

    def reference(self, config, x, w, b):
        return jax.nn.relu(linear(x, w, b))

    template_part = """
    def epilogue(acc, b):
        return jnp.maximum(acc + b, 0.0)

    """ + BIAS_GLUE


class MatmulDivideGelu(MatmulWorkload):
    name, jaxbench_id = "matmul_divide_gelu", "44k"
    description = "gelu((x@W + b) / 10)"
    defaults = {"batch_size": 4096, "input_size": 8192, "output_size": 8192, "divisor": 10.0, "dtype": "bfloat16"}
    k_key, n_key = "input_size", "output_size"
    params = standard(k="input_size", n="output_size")

    def reference(self, config, x, w, b):
        return jax.nn.gelu(linear(x, w, b) / config["divisor"])

    template_part = """
    def epilogue(acc, b):
        return gelu((acc + b) / CONFIG["divisor"])

    """ + BIAS_GLUE


class MatmulAddSwishTanhGeluHardtanh(MatmulWorkload):
    name, jaxbench_id = "matmul_add_swish_tanh_gelu_hardtanh", "47k"
    description = "clip(gelu(tanh(swish(x@W + b + add_value))), -1, 1)"
    defaults = {**SQUARE, "dtype": "bfloat16"}
    params = (*STANDARD, *bias_params("add_value"))

    def reference(self, config, x, w, b, add_value):
        return jnp.clip(jax.nn.gelu(jnp.tanh(jax.nn.swish(linear(x, w, b) + add_value))), -1.0, 1.0)

    template_part = """
    def epilogue(acc, b, add_value):
        return jnp.clip(gelu(jnp.tanh(swish(acc + b + add_value))), -1.0, 1.0)


    def workload(x, w, b, add_value):
        return fused_matmul(x, w, (row(b), row(add_value)), epilogue=epilogue, **tiling())
    """


class MatmulBatchnormBiasaddDivideSwish(MatmulWorkload):
    """48k. The check's seeds draw the running mean and variance, bn_scale and bn_bias around
    0 and 1 (``kernelbench.constant``): an eval-mode norm that assumes a zero mean and unit
    variance passes on the spec's constants and fails there (tests/test_check_inputs.py)."""

    category = "matmul+norm"
    name, jaxbench_id = "matmul_batchnorm_biasadd_divide_swish", "48k"
    description = "swish((eval_batchnorm(x@W + b) + bias) / 1.0)"
    defaults = {**SQUARE, "bn_eps": 1e-05, "bn_momentum": 0.1, "divide_value": 1.0, "dtype": "bfloat16"}
    params = (x_param(), weight(("in_features", "out_features"), "in_features"), *bias_params("lin_b"),
              *constant_params("ones", "bn_scale"), *constant_params("zeros", "bn_bias", "bn_mean"),
              *constant_params("ones", "bn_var"), Param("bias", (1,)))

    def reference(self, config, x, w, lin_b, bn_scale, bn_bias, bn_mean, bn_var, bias):
        v = linear(x, w, lin_b)
        v = bn_scale * ((v - bn_mean) / jnp.sqrt(bn_var + config["bn_eps"])) + bn_bias
        return jax.nn.swish((v + bias) / config["divide_value"])

    template_part = """
    def epilogue(acc, lin_b, bn_scale, bn_bias, bn_mean, bn_var, bias):
        v = (acc + lin_b - bn_mean) * jax.lax.rsqrt(bn_var + CONFIG["bn_eps"]) * bn_scale + bn_bias
        return swish((v + bias) / CONFIG["divide_value"])


    def workload(x, w, lin_b, bn_scale, bn_bias, bn_mean, bn_var, bias):
        operands = (row(lin_b), row(bn_scale), row(bn_bias), row(bn_mean), row(bn_var), row(bias))
        return fused_matmul(x, w, operands, epilogue=epilogue, **tiling())
    """


class BmmInstancenormSumResidualaddMultiply(MatmulWorkload):
    """26k: the GEMM is dead code (module docstring); the template computes it anyway."""

    category = "matmul+norm"
    name, jaxbench_id = "bmm_instancenorm_sum_residualadd_multiply", "26k"
    description = "(instance_norm_1x1(x@W.T + b) + y) * y"
    defaults = {**SQUARE, "dtype": "bfloat16"}
    params = (x_param(), Param("y", ("batch_size", "out_features"), "uniform", kb.K0),
              weight(("out_features", "in_features"), "in_features", key=kb.K42), *bias_params("b", key=kb.K42),
              *constant_params("ones", "in_weight"), *bias_params("in_bias", key=kb.K42))

    def reference(self, config, x, y, w, b, in_weight, in_bias):
        v = linear(x, w, b, transpose=True)[:, :, None, None]  # InstanceNorm2d on (N, C, 1, 1)
        v = (v - v.mean((2, 3), keepdims=True)) / jnp.sqrt(v.var((2, 3), keepdims=True) + EPS)
        v = v[:, :, 0, 0] * in_weight + in_bias
        return (v + y) * y

    def essential_work(self, config):
        # The GEMM is dead (a 1x1 InstanceNorm is exactly 0, times in_weight): out = (in_bias + y) * y.
        return float(io_bytes(self, config, skip=(0, 2, 3, 4))), 0.0  # reads y, in_bias; writes out

    extra_knobs = (Knob("gemm", ("computed", "skipped"), "computed",
                        "'skipped': the GEMM feeds a norm over a 1x1 extent, which is 0 whatever it "
                        "computes, so out = (in_bias + y) * y"),)
    template_part = """
    def epilogue(acc, b, in_weight, in_bias, y):
        v = acc + b
        normed = (v - v) * jax.lax.rsqrt(jnp.zeros_like(v) + 1e-5)  # statistics over a 1x1 extent
        return (normed * in_weight + in_bias + y) * y


    def residual_kernel(in_bias_ref, y_ref, o_ref):
        y = y_ref[...].astype(jnp.float32)
        o_ref[...] = ((in_bias_ref[...].astype(jnp.float32) + y) * y).astype(o_ref.dtype)


    def workload(x, y, w, b, in_weight, in_bias):
        if SCHEDULE["gemm"] == "skipped":
            s = SCHEDULE
            m, n = y.shape
            bm, bn = s["block_m"], s["block_n"]
            return pl.pallas_call(
                residual_kernel, grid=(m // bm, n // bn),
                in_specs=[pl.BlockSpec((1, bn), lambda i, j: (0, j)), pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
                out_shape=jax.ShapeDtypeStruct(y.shape, y.dtype),
                compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
            )(row(in_bias), y)
        return fused_matmul(x, w, (row(b), row(in_weight), row(in_bias), y), epilogue=epilogue,
                            transpose_w=True, **tiling())
    """


class GemmBatchnormGeluRelu(MatmulWorkload):
    """31k: training-mode BatchNorm needs every row's statistics, so the kernel fuses the
    bias and XLA glue does the norm: fusing the column statistics is left as headroom."""

    category = "matmul+norm"
    name, jaxbench_id = "gemm_batchnorm_gelu_relu", "31k"
    description = "relu(gelu(train_batchnorm(x@W.T + b)))"
    defaults = {"batch_size": 16384, "in_features": 8192, "out_features": 8192, "dtype": "bfloat16"}
    atol = 5e-2
    params = (x_param(), weight(("out_features", "in_features"), "in_features", "unit", kb.K0),
              Param("b", ("out_features",), "unit", kb.K0), *constant_params("ones", "bn_weight"),
              *constant_params("zeros", "bn_bias"))

    def reference(self, config, x, w, b, bn_weight, bn_bias):
        v = linear(x, w, b, transpose=True)
        mean = jnp.mean(v, axis=0)
        var = jnp.mean((v - mean) ** 2, axis=0)  # in the input dtype (section 7)
        return jax.nn.relu(jax.nn.gelu((v - mean) / jnp.sqrt(var + EPS) * bn_weight + bn_bias))

    template_part = """
    def epilogue(acc, b):
        return acc + b


    def workload(x, w, b, bn_weight, bn_bias):
        v = fused_matmul(x, w, (row(b),), epilogue=epilogue, transpose_w=True, **tiling())
        mean = jnp.mean(v, axis=0)
        var = jnp.mean((v - mean) ** 2, axis=0)
        return jnp.maximum(jax.nn.gelu((v - mean) / jnp.sqrt(var + 1e-5) * bn_weight + bn_bias), 0)
    """


# --- group norms over adjacent features -------------------------------------------------------


class MatmulSwishSumGroupnorm(MatmulWorkload):
    category = "matmul+norm"
    name, jaxbench_id = "matmul_swish_sum_groupnorm", "29k"
    description = "group_norm(swish(x@W) + b, 64 groups)"
    defaults = {"batch_size": 8192, "in_features": 4096, "out_features": 4096, "num_groups": 64, "dtype": "bfloat16"}
    group_key = "num_groups"
    params = (*STANDARD, *constant_params("ones", "gn_weight"), *constant_params("zeros", "gn_bias"))

    def reference(self, config, x, w, b, gn_weight, gn_bias):
        return group_norm(jax.nn.swish(linear(x, w)) + b, config["num_groups"], gn_weight, gn_bias)

    template_part = """
    def epilogue(acc, b, gn_weight, gn_bias):
        group = CONFIG["out_features"] // CONFIG["num_groups"]
        return group_norm(swish(acc) + b, group, 1e-5, gn_weight, gn_bias)


    def workload(x, w, b, gn_weight, gn_bias):
        return fused_matmul(x, w, (row(b), row(gn_weight), row(gn_bias)), epilogue=epilogue, **tiling())
    """


class GemmGroupnormSwishMultiplySwish(MatmulWorkload):
    category = "matmul+norm"
    name, jaxbench_id = "gemm_groupnorm_swish_multiply_swish", "45k"
    description = "swish(swish(group_norm(x@W.T + b, 256 groups)) * multiply_weight)"
    defaults = {**SQUARE, "num_groups": 256, "dtype": "bfloat16"}
    atol = 5e-2
    group_key = "num_groups"
    params = (x_param(), weight(("out_features", "in_features"), "in_features", key=kb.K42),
              *bias_params("b", key=kb.K42), *constant_params("ones", "gn_weight"),
              *constant_params("zeros", "gn_bias"), Param("multiply_weight", ("out_features",), "unit", kb.K42))

    def reference(self, config, x, w, b, gn_weight, gn_bias, multiply_weight):
        v = group_norm(linear(x, w, b, transpose=True), config["num_groups"], gn_weight, gn_bias)
        return jax.nn.swish(jax.nn.swish(v) * multiply_weight)

    template_part = """
    def epilogue(acc, b, gn_weight, gn_bias, multiply_weight):
        group = CONFIG["out_features"] // CONFIG["num_groups"]
        return swish(swish(group_norm(acc + b, group, 1e-5, gn_weight, gn_bias)) * multiply_weight)


    def workload(x, w, b, gn_weight, gn_bias, multiply_weight):
        operands = (row(b), row(gn_weight), row(gn_bias), row(multiply_weight))
        return fused_matmul(x, w, operands, epilogue=epilogue, transpose_w=True, **tiling())
    """


# --- epilogues over whole rows ------------------------------------------------------------------


class RowMatmulWorkload(MatmulWorkload):
    category = "matmul+reduction"
    whole_rows = True


class GemmDivideSumScaling(RowMatmulWorkload):
    name, jaxbench_id = "gemm_divide_sum_scaling", "21k"
    description = "1.5 * sum_j (x@W.T)[:, j] / 2, keepdims (HIGHEST precision)"
    defaults = {"batch_size": 4096, "input_size": 8192, "hidden_size": 8192, "scaling_factor": 1.5,
                "dtype": "bfloat16"}
    k_key, n_key = "input_size", "hidden_size"
    params = (x_param(k="input_size", key=kb.K0), weight(("hidden_size", "input_size"), "input_size", "unit", kb.K0))

    def reference(self, config, x, w):
        v = linear(x, w, transpose=True, precision=jax.lax.Precision.HIGHEST) / 2
        return jnp.sum(v, axis=1, keepdims=True) * config["scaling_factor"]

    def essential_work(self, config):
        # The row sum of x @ W.T is the mat-vec x @ (sum_j W_j): every input read, 2 M K FLOPs.
        return float(io_bytes(self, config)), 2.0 * config["batch_size"] * config["input_size"]

    extra_knobs = (FOLD,)
    template_part = """
    def epilogue(acc):
        return jnp.sum(acc / 2, axis=-1, keepdims=True) * CONFIG["scaling_factor"]


    def folded_epilogue(row_sums):
        return row_sums / 2 * CONFIG["scaling_factor"]


    def workload(x, w):
        if SCHEDULE["fold"] == "weights":
            return folded_matmul(x, w, epilogue=folded_epilogue, transpose_w=True, **tiling())
        return fused_matmul(x, w, epilogue=epilogue, transpose_w=True, out_cols=1, **tiling())
    """


class MatmulSumMaxAvgpoolLogsumexpLogsumexp(RowMatmulWorkload):
    name, jaxbench_id = "matmul_sum_max_avgpool_logsumexp_logsumexp", "23k"
    description = "row sum of x@W.T + b; then max, mean, logsumexp, logsumexp over a size-1 axis"
    defaults = {**SQUARE, "dtype": "bfloat16"}
    params = STANDARD_T

    def reference(self, config, x, w, b):
        s = jnp.sum(linear(x, w, b, transpose=True), axis=1, keepdims=True)
        s = jnp.max(s, axis=1, keepdims=True)
        s = jnp.mean(s, axis=1, keepdims=True)
        s = jax.nn.logsumexp(s, axis=1, keepdims=True)
        return jax.nn.logsumexp(s, axis=1, keepdims=True)

    def essential_work(self, config):
        # The row sum of x @ W.T + b is the mat-vec x @ (sum_j W_j) + sum(b), and the reductions
        # after it are over a size-1 axis: every input read, 2 M K FLOPs.
        return float(io_bytes(self, config)), 2.0 * config["batch_size"] * config["in_features"]

    extra_knobs = (FOLD,)
    template_part = """
    def epilogue(acc, b):
        return jnp.sum(acc + b, axis=-1, keepdims=True)  # max, mean and logsumexp of one value are itself


    def folded_epilogue(row_sums, b_sum):
        return row_sums + b_sum


    def workload(x, w, b):
        if SCHEDULE["fold"] == "weights":
            b_sum = jnp.sum(b.astype(jnp.float32)).reshape(1, 1)
            return folded_matmul(x, w, (b_sum,), epilogue=folded_epilogue, transpose_w=True, **tiling())
        return fused_matmul(x, w, (row(b),), epilogue=epilogue, transpose_w=True, out_cols=1, **tiling())
    """


class MatmulScaleResidualaddClampLogsumexpMish(RowMatmulWorkload):
    name, jaxbench_id = "matmul_scale_residualadd_clamp_logsumexp_mish", "24k"
    description = "l = logsumexp(clip(4 * (x@W.T + b), -10, 10)); l * mish(l)"
    defaults = {"batch_size": 4096, "input_size": 8192, "hidden_size": 8192, "scale_factor": 2.0,
                "clamp_min": -10.0, "clamp_max": 10.0, "dtype": "bfloat16"}
    k_key, n_key = "input_size", "hidden_size"
    params = standard(kb.K42, transpose=True, k="input_size", n="hidden_size")

    def reference(self, config, x, w, b):
        v = linear(x, w, b, transpose=True) * config["scale_factor"]
        v = jnp.clip(v + v, config["clamp_min"], config["clamp_max"])
        lse = jax.nn.logsumexp(v, axis=1, keepdims=True)
        return lse * (lse * jnp.tanh(jnp.logaddexp(lse, 0)))

    online_rows = True
    template_part = """
    def epilogue(acc, b):
        v = (acc + b) * CONFIG["scale_factor"]
        return lse_carries(jnp.clip(v + v, CONFIG["clamp_min"], CONFIG["clamp_max"]))


    def workload(x, w, b):
        return fused_matmul(x, w, (row(b),), epilogue=epilogue, transpose_w=True, out_cols=1,
                            reduction=logsumexp_reduction(lambda lse: lse * mish(lse)), **tiling())
    """


class GemmSigmoidLogsumexp(RowMatmulWorkload):
    """32k: two matmuls, each with its epilogue fused; the hidden activations make one HBM
    round trip, which fusing the two into one kernel would save.

    Input fix: w2 is N*0.2, not 0.02. With the spec's scale every row's 1024-way
    logsumexp is log(1024) + 0.2 give or take 0.006, so a constant output passed."""

    category = "2xmatmul+reduction"
    name, jaxbench_id = "gemm_sigmoid_logsumexp", "32k"
    description = "logsumexp(sigmoid(x@W1.T + b1) @ W2.T + b2)"
    defaults = {"batch_size": 16384, "input_size": 2048, "hidden_size": 4096, "output_size": 1024,
                "dtype": "bfloat16"}
    k_key, n_key = "input_size", "output_size"
    params = (x_param(k="input_size"),
              Param("w1", ("hidden_size", "input_size"), "normal", kb.K42, "input_size"),
              *bias_params("b1", key=kb.K42, n="hidden_size"),
              Param("w2", ("output_size", "hidden_size"), "normal", kb.K42, "hidden_size", scale=0.2),
              *bias_params("b2", key=kb.K42, n="output_size"))

    extra_dims = ("hidden_size",)

    def validate_shapes(self, config):
        if config["hidden_size"] % 256:
            raise ValueError(f"{self.name}: hidden_size must be a multiple of 256 (the smallest block_k)")

    def reference(self, config, x, w1, b1, w2, b2):
        h = jax.nn.sigmoid(linear(x, w1, b1, transpose=True))
        return jax.nn.logsumexp(linear(h, w2, b2, transpose=True), axis=1)

    template_part = """
    def hidden_epilogue(acc, b1):
        return jax.nn.sigmoid(acc + b1)


    def logsumexp_epilogue(acc, b2):
        return logsumexp_rows(acc + b2)


    def workload(x, w1, b1, w2, b2):
        hidden_k = tiling()["bk"]  # the second matmul contracts over hidden_size (None: all of it)
        while hidden_k and CONFIG["hidden_size"] % hidden_k:
            hidden_k //= 2
        h = fused_matmul(x, w1, (row(b1),), epilogue=hidden_epilogue, transpose_w=True, **tiling())
        z = fused_matmul(h, w2, (row(b2),), epilogue=logsumexp_epilogue, transpose_w=True, out_cols=1,
                         **{**tiling(), "bk": hidden_k})
        return z[:, 0]
    """


class MatmulSigmoidSum(RowMatmulWorkload):
    name, jaxbench_id = "matmul_sigmoid_sum", "36k"
    description = "sum_j sigmoid(x@W + b), keepdims"
    defaults = {"batch_size": 4096, "input_size": 8192, "hidden_size": 8192, "dtype": "bfloat16"}
    k_key, n_key = "input_size", "hidden_size"
    params = standard(kb.K42, k="input_size", n="hidden_size")

    def reference(self, config, x, w, b):
        return jnp.sum(jax.nn.sigmoid(linear(x, w, b)), axis=1, keepdims=True)

    online_rows = True
    template_part = """
    def epilogue(acc, b):
        return (jnp.sum(jax.nn.sigmoid(acc + b), axis=-1, keepdims=True),)


    def workload(x, w, b):
        return fused_matmul(x, w, (row(b),), epilogue=epilogue, out_cols=1, reduction=SUM_REDUCTION, **tiling())
    """


class MatmulDropoutSoftmax(SoftmaxTolerance, RowMatmulWorkload):
    name, jaxbench_id = "matmul_dropout_softmax", "38k"
    category = "matmul+softmax"
    description = "softmax(x@W.T + b); dropout is the identity (eval mode)"
    defaults = {**SQUARE, "dropout_p": 0.2, "dtype": "bfloat16"}
    params = standard(kb.K42, transpose=True)

    def reference(self, config, x, w, b):
        return jax.nn.softmax(linear(x, w, b, transpose=True), axis=1)

    online_rows = True
    template_part = """
    def epilogue(acc, b):
        return acc + b


    def workload(x, w, b):
        return row_mapped_matmul(x, w, (row(b),), epilogue=epilogue, row_map=SOFTMAX, transpose_w=True,
                                 **tiling())
    """


class GemmGroupnormMinBiasadd(RowMatmulWorkload):
    name, jaxbench_id = "gemm_groupnorm_min_biasadd", "40k"
    category = "matmul+norm+reduction"
    description = "min_j group_norm(x@W.T + b, 512 groups) + bias, broadcast to (1, N, M, 1)"
    defaults = {**SQUARE, "num_groups": 512, "dtype": "bfloat16"}
    group_key = "num_groups"
    params = (x_param(), weight(("out_features", "in_features"), "in_features"), *bias_params("lin_b"),
              *constant_params("ones", "gn_weight"), *constant_params("zeros", "gn_bias"),
              Param("bias", (1, "out_features", 1, 1)))

    def reference(self, config, x, w, lin_b, gn_weight, gn_bias, bias):
        v = group_norm(linear(x, w, lin_b, transpose=True), config["num_groups"], gn_weight, gn_bias)
        return jnp.min(v, axis=1, keepdims=True).reshape(1, 1, -1, 1) + bias

    online_rows = True
    template_part = """
    def epilogue(acc, lin_b, gn_weight, gn_bias):
        group = CONFIG["out_features"] // CONFIG["num_groups"]
        return (jnp.min(group_norm(acc + lin_b, group, 1e-5, gn_weight, gn_bias), axis=-1, keepdims=True),)


    def workload(x, w, lin_b, gn_weight, gn_bias, bias):
        m = fused_matmul(x, w, (row(lin_b), row(gn_weight), row(gn_bias)), epilogue=epilogue,
                         transpose_w=True, out_cols=1, reduction=MIN_REDUCTION, **tiling())
        return m.reshape(1, 1, -1, 1) + bias
    """


class GemmMaxSubtractGelu(RowMatmulWorkload):
    name, jaxbench_id = "gemm_max_subtract_gelu", "42k"
    category = "matmul+row-reduction"
    description = "v = x@W + b; gelu(v - rowmax(v))"
    defaults = {**SQUARE, "max_dim": 1, "dtype": "bfloat16"}
    params = (x_param(), weight(("in_features", "out_features"), "in_features", key=kb.K0),
              *bias_params("b", key=kb.K0))

    def validate_shapes(self, config):
        if config["max_dim"] != 1:
            raise ValueError(f"{self.name}: max_dim must be 1 (the feature axis), got {config['max_dim']}")

    def reference(self, config, x, w, b):
        v = linear(x, w, b)
        return jax.nn.gelu(v - jnp.max(v, axis=config["max_dim"], keepdims=True))

    online_rows = True
    template_part = """
    def epilogue(acc, b):
        return acc + b


    def workload(x, w, b):
        return row_mapped_matmul(x, w, (row(b),), epilogue=epilogue, row_map=after_row_max(gelu), **tiling())
    """


class GemmBatchnormScalingSoftmax(SoftmaxTolerance, RowMatmulWorkload):
    """43k. At the check's seeds the running statistics, bn_scale and scale are not 0 and 1 (a
    kernel that skips them fails), so each of the bf16 reference's norm ops rounds the logits
    once more: the float32 check widens its tolerance 13-30x there (7x at seed 0), measured on
    seeds 1-5; smaller constants do not help (it is the number of roundings), and what it
    still rejects is softmax error of more than ~15-30% of an entry."""

    name, jaxbench_id = "gemm_batchnorm_scaling_softmax", "43k"
    category = "matmul+softmax"
    description = "softmax(scale * eval_batchnorm(x@W + b))"
    defaults = {**SQUARE, "bn_eps": 1e-05, "bn_momentum": 0.1, "dtype": "bfloat16"}
    params = (x_param(), weight(("in_features", "out_features"), "in_features", key=kb.K42),
              *bias_params("b", key=kb.K42), *constant_params("ones", "bn_scale"),
              *bias_params("bn_bias", key=kb.K42), *constant_params("zeros", "bn_mean"),
              *constant_params("ones", "bn_var"), Param("scale", (1,), "ones"))

    def reference(self, config, x, w, b, bn_scale, bn_bias, bn_mean, bn_var, scale):
        v = linear(x, w, b)
        v = bn_scale * ((v - bn_mean) / jnp.sqrt(bn_var + config["bn_eps"])) + bn_bias
        return jax.nn.softmax(scale * v, axis=1)

    online_rows = True
    template_part = """
    def epilogue(acc, b, bn_scale, bn_bias, bn_mean, bn_var, scale):
        v = (acc + b - bn_mean) * jax.lax.rsqrt(bn_var + CONFIG["bn_eps"]) * bn_scale + bn_bias
        return scale * v


    def workload(x, w, b, bn_scale, bn_bias, bn_mean, bn_var, scale):
        operands = (row(b), row(bn_scale), row(bn_bias), row(bn_mean), row(bn_var), row(scale))
        return row_mapped_matmul(x, w, operands, epilogue=epilogue, row_map=SOFTMAX, **tiling())
    """


class MatmulAvgpoolGeluScaleMax(RowMatmulWorkload):
    """49k. The pool is JAXBench's: ``lax.reduce_window`` summing each window of
    pool_kernel_size columns in the input dtype, then dividing by the window. In bf16 that sum
    rounds as it goes (jnp.mean would accumulate in f32), some 0.01-0.04 on pooled values of
    ~1, so the float32 check widens its tolerance 1.1-3.1x (measured on 13 seeds) to keep
    this baseline within half of it; a kernel that pools in f32 is more accurate and passes."""

    name, jaxbench_id = "matmul_avgpool_gelu_scale_max", "49k"
    category = "matmul+pool+reduction"
    description = "max_j 2 * gelu(avgpool16(x@W + b))"
    defaults = {**SQUARE, "pool_kernel_size": 16, "scale_factor": 2.0, "dtype": "bfloat16"}
    extra_dims = ("pool_kernel_size",)
    params = STANDARD

    def validate_shapes(self, config):
        if config["out_features"] % config["pool_kernel_size"]:
            raise ValueError(f"{self.name}: pool_kernel_size must divide out_features")

    def reference(self, config, x, w, b):
        # AvgPool1d as JAXBench writes it: a strided window sum over a (M, 1, N) view, in the
        # input dtype, divided by the window (class docstring).
        k = config["pool_kernel_size"]
        v = linear(x, w, b)[:, None, :]
        v = jax.lax.reduce_window(v, 0.0, jax.lax.add, (1, 1, k), (1, 1, k), "VALID") / k
        return jnp.max(jax.nn.gelu(v[:, 0, :]) * config["scale_factor"], axis=1)

    def essential_work(self, config):
        # The average pool of x @ W + b is x @ (W averaged over each pool's columns) + pooled b:
        # every input read, the matmul's FLOPs over N / pool_kernel_size columns.
        m, k, n = config["batch_size"], config["in_features"], config["out_features"]
        return float(io_bytes(self, config)), 2.0 * m * k * (n // config["pool_kernel_size"])

    extra_knobs = (Knob("fold", ("none", "weights"), "none",
                        "'weights': the average pool after the matmul folded into it: x @ (w's pooled "
                        "columns) + pooled b, pool_kernel_size times fewer FLOPs, exact up to rounding"),)

    def folded_columns(self, config):
        return config["out_features"] // config["pool_kernel_size"]
    template_part = """
    def epilogue(acc, b):
        # Each column holds its pool's mean, repeated, so the row max is the max over pools.
        pooled = group_mean(acc + b, CONFIG["pool_kernel_size"])
        return jnp.max(gelu(pooled) * CONFIG["scale_factor"], axis=-1, keepdims=True)


    def pooled_epilogue(acc, b):
        return jnp.max(gelu(acc + b) * CONFIG["scale_factor"], axis=-1, keepdims=True)


    def pool_kernel(w_ref, o_ref):
        # Mosaic cannot split lanes into (pools, pool): a block-averaging matrix on the MXU
        # does it, exactly (1/pool is a power of two here or rounds once), accumulating in f32.
        cols, pooled = w_ref.shape[1], o_ref.shape[1]
        p = cols // pooled
        avg = jnp.where(jax.lax.broadcasted_iota(jnp.int32, (cols, pooled), 0) // p
                        == jax.lax.broadcasted_iota(jnp.int32, (cols, pooled), 1), 1.0 / p, 0.0)
        o_ref[...] = jnp.dot(w_ref[...], avg.astype(w_ref.dtype),
                             preferred_element_type=jnp.float32).astype(o_ref.dtype)


    def pool_columns(w):
        \"\"\"(K, N) -> (K, N / pool): each run of pool_kernel_size columns averaged.\"\"\"
        k, n = w.shape
        pooled = n // CONFIG["pool_kernel_size"]
        cols = min(n, 128 * CONFIG["pool_kernel_size"])  # 128 pooled columns (one lane tile) per block
        cols = cols if n % cols == 0 else n
        rows = min(k, 512)
        return pl.pallas_call(
            pool_kernel, grid=(k // rows, n // cols),
            in_specs=[pl.BlockSpec((rows, cols), lambda i, j: (i, j))],
            out_specs=pl.BlockSpec((rows, cols * pooled // n), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((k, pooled), w.dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        )(w)


    def workload(x, w, b):
        if SCHEDULE["fold"] == "weights":
            p = CONFIG["pool_kernel_size"]
            bp = b.astype(jnp.float32).reshape(1, -1, p).mean(-1)  # N floats
            return fused_matmul(x, pool_columns(w), (bp,), epilogue=pooled_epilogue, out_cols=1,
                                **tiling())[:, 0]
        return fused_matmul(x, w, (row(b),), epilogue=epilogue, out_cols=1, **tiling())[:, 0]
    """


class MatmulGeluSoftmax(SoftmaxTolerance, RowMatmulWorkload):
    name, jaxbench_id = "matmul_gelu_softmax", "50k"
    category = "matmul+softmax"
    description = "softmax(gelu(x@W + b))"
    defaults = {**SQUARE, "dtype": "bfloat16"}
    params = standard(kb.K42)

    def reference(self, config, x, w, b):
        return jax.nn.softmax(jax.nn.gelu(linear(x, w, b)), axis=1)

    online_rows = True
    template_part = """
    def epilogue(acc, b):
        return gelu(acc + b)


    def workload(x, w, b):
        return row_mapped_matmul(x, w, (row(b),), epilogue=epilogue, row_map=SOFTMAX, **tiling())
    """


MATMUL_WORKLOADS = (
    MatmulSubtractMultiplyRelu, GemmMultiplyLeakyRelu, GemmDivideSumScaling,
    MatmulSumMaxAvgpoolLogsumexpLogsumexp, MatmulScaleResidualaddClampLogsumexpMish,
    BmmInstancenormSumResidualaddMultiply, MatmulMishMish, MatmulSwishSumGroupnorm, MatmulScalingResidualAdd,
    GemmBatchnormGeluRelu, GemmSigmoidLogsumexp, GemmScalingHardtanhGelu, MatmulSigmoidSum, MatmulSwishScaling,
    MatmulDropoutSoftmax, GemmGroupnormMinBiasadd, GemmAddRelu, GemmMaxSubtractGelu, GemmBatchnormScalingSoftmax,
    MatmulDivideGelu, GemmGroupnormSwishMultiplySwish, MatmulAddSwishTanhGeluHardtanh,
    MatmulBatchnormBiasaddDivideSwish, MatmulAvgpoolGeluScaleMax, MatmulGeluSoftmax,
)
