"""Kernels' leading operands (dynamic grid bounds, scalar-prefetch tables) evaluated from an
exported artifact alone: the same values as the jaxpr route (``pallas.prefetch_operands``)
on megablox and paged attention at full size, ``[]`` for a kernel without any, None for a
kernel inside a loop or in a function called twice, and an artifact whose tables need a
foreign custom call refused."""

from jaxbench_env.aot import prepare_process

prepare_process()

import dataclasses  # noqa: E402
import re  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.extend.core import jaxpr_as_fun  # noqa: E402

import workloads  # noqa: E402
from jaxbench_env import candidate_process as cp  # noqa: E402
from jaxbench_env.aot import v6e_device  # noqa: E402
from jaxbench_env.sim import mosaic  # noqa: E402
from jaxbench_env.sim.pallas import pallas_call_eqns, prefetch_operands  # noqa: E402
from jaxbench_env.sim.prefetch import PrefetchError, leading_operand_count, prefetch_tables  # noqa: E402

ROWS, COLS, BLOCK = 128, 128, 8  # x: 16 blocks of 8 rows


def artifact(name, source):
    manifest, blobs = cp.build_artifacts({"workload": name, "source": source})
    assert manifest["error"] is None, manifest["error"]
    return jax.export.deserialize(bytearray(blobs["full_tpu"]))


def jaxpr_tables(name, source):
    """What the jaxpr route gives, one entry per pallas_call ([] where it has none)."""
    wl = workloads.get(name)
    module = cp.load_module(source, wl.config, {})
    closed = jax.jit(module.workload).trace(*cp.input_specs(wl, wl.config)).jaxpr
    found = prefetch_operands(closed, lambda: wl.make_inputs(wl.config, 0))
    return [found.get(id(eqn), []) for eqn in pallas_call_eqns(closed.jaxpr)]


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g is not None and len(g) == len(w)
        for a, b in zip(g, w):
            assert isinstance(a, np.ndarray) and a.shape == np.shape(b)
            np.testing.assert_array_equal(a, np.asarray(b))


@pytest.mark.parametrize("name,which", [("megablox_gmm", "template"), ("megablox_gmm", "expert"),
                                        ("paged_attention", "template")])
def test_tables_match_the_jaxpr_route_at_full_size(name, which):
    # Full-size inputs are built inside the jit (megablox's weights alone are 1.9 GB, and
    # building them eagerly takes over 12 GB): XLA builds only what the tables read.
    wl = workloads.get(name)
    source = wl.template_source() if which == "template" else wl.expert_source()
    exported = artifact(name, source)
    got = prefetch_tables(exported, lambda: wl.make_inputs(wl.config, 0))
    want = jaxpr_tables(name, source)
    assert any(want)
    assert_same(got, want)
    if which == "expert":  # jax's megablox: a grid axis sized at run time, then 4 tables
        assert got[0][0].shape == () and int(got[0][0]) > 0 and len(got[0]) == 5


def test_a_kernel_without_leading_operands_gives_an_empty_list():
    wl = workloads.get("gemm")
    exported = artifact("gemm", wl.template_source())
    assert prefetch_tables(exported, lambda: pytest.fail("nothing to evaluate: inputs not built")) == [[]]


# A hand-made program: a top-level kernel whose table comes from the inputs, the same kernel
# inside a fori_loop (runs per trip with other tables: None), and a kernel without a grid.

def copy_kernel(table_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...]


def gathered(table, x):
    """Row blocks of x in the order ``table`` gives."""
    steps = table.shape[0]
    return pl.pallas_call(
        copy_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(steps,),
            in_specs=[pl.BlockSpec((BLOCK, COLS), lambda i, t: (t[i], 0))],
            out_specs=pl.BlockSpec((BLOCK, COLS), lambda i, t: (i, 0)),
        ),
        out_shape=jax.ShapeDtypeStruct((steps * BLOCK, COLS), x.dtype),
    )(table, x)


def add_one(x):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def program(idx, x):
    top = gathered((idx * 3) % 16, x)

    def body(i, acc):
        return acc + gathered((idx[:8] + i) % 16, x)

    looped = jax.lax.fori_loop(0, 2, body, jnp.zeros((8 * BLOCK, COLS), x.dtype))
    return top, looped, add_one(x)


SPECS = [jax.ShapeDtypeStruct((16,), jnp.int32), jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32)]


def hand_made():
    """Exported as the candidate process exports: each kernel in a function of its own."""
    closed = cp.wrap_kernels(jax.jit(program).trace(*SPECS).jaxpr, False)
    with jax.default_device(v6e_device()):
        exported = jax.export.export(jax.jit(jaxpr_as_fun(closed)), platforms=["tpu"])(*SPECS)
    return jax.export.deserialize(exported.serialize())


def inputs():
    return np.arange(16, dtype=np.int32) * 5 + 1, np.ones((ROWS, COLS), np.float32)


def test_a_kernel_in_a_loop_gives_none():
    exported = hand_made()
    text = exported.mlir_module()
    calls = mosaic.stablehlo_custom_calls(text)
    assert len(calls) == 3 and "stablehlo.while" in text  # the loop is not unrolled
    tables = prefetch_tables(exported, inputs())
    idx, _ = inputs()
    for call, got in zip(calls, tables):
        first = call.operands[0][0]
        if first == (16,):  # the top-level kernel
            assert leading_operand_count(call) == 1
            assert len(got) == 1 and got[0].dtype == np.int32
            np.testing.assert_array_equal(got[0], (idx * 3) % 16)
        elif first == (8,):  # the one in the loop
            assert leading_operand_count(call) == 1 and got is None
        else:  # no grid, no tables
            assert leading_operand_count(call) == 0 and got == []
    # the inputs given as a function: the same values
    later = prefetch_tables(exported, inputs)
    assert [t if t is None else [a.tolist() for a in t] for t in later] == \
        [t if t is None else [a.tolist() for a in t] for t in tables]


def test_a_kernel_in_a_function_called_twice_gives_none():
    kernel = jax.jit(gathered, inline=False)

    def twice(idx, x):
        return kernel(idx % 16, x), kernel((idx + 1) % 16, x)

    with jax.default_device(v6e_device()):
        exported = jax.export.export(jax.jit(twice), platforms=["tpu"])(*SPECS)
    text = exported.mlir_module()
    assert len(mosaic.stablehlo_custom_calls(text)) == 1 and len(re.findall(r"call @gathered", text)) == 2
    assert prefetch_tables(exported, inputs()) == [None]


def test_tables_that_need_a_foreign_custom_call_are_refused():
    # A tampered artifact: the table's multiply replaced by a custom call the CPU would run.
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir.dialects import hlo

    exported = hand_made()
    text, n = re.subn(r"(%\S+) = stablehlo\.multiply (%\S+), (%\S+) : tensor<16xi32>",
                      r"\1 = stablehlo.custom_call @host_code(\2, \3) : (tensor<16xi32>, tensor<16xi32>) -> tensor<16xi32>",
                      exported.mlir_module())
    assert n == 1
    with mlir.make_ir_context():
        blob = hlo.serialize_portable_artifact_str(text, hlo.get_current_version())
    tampered = dataclasses.replace(exported, mlir_module_serialized=blob)
    with pytest.raises(PrefetchError, match="host_code"):
        prefetch_tables(tampered, inputs())


def test_tables_computed_from_a_kernel_output_are_refused():
    # The second kernel's table is the first kernel's output: with kernels replaced by zeros
    # it would be priced on a made-up table, so the program is refused, naming why.
    def chained(idx, x):
        table = add_one(idx.astype(jnp.float32).reshape(1, 16)).reshape(16).astype(jnp.int32) % 16
        return gathered(table, x), gathered(idx % 16, x)

    closed = cp.wrap_kernels(jax.jit(chained).trace(*SPECS).jaxpr, False)
    with jax.default_device(v6e_device()):
        exported = jax.export.export(jax.jit(jaxpr_as_fun(closed)), platforms=["tpu"])(*SPECS)
    with pytest.raises(PrefetchError, match="computed from another kernel's output"):
        prefetch_tables(jax.export.deserialize(exported.serialize()), inputs())
