"""What ``sim.hlo`` charges the ops of an optimized HLO module, on text as libtpu writes it
(lines taken from real v6e compiles, trimmed): async copies by what they move, slices by
their window, every branch of a conditional."""

from __future__ import annotations

from jaxbench_env.sim import hlo

MIB = 2**20
# At batch 1 XLA streams a 16 MiB array into VMEM in 4 MiB chunks; the weights are copied
# into VMEM whole; a 16 MiB parameter is sliced on the XLA side.
CHUNKED = """\
HloModule jit_f, entry_computation_layout={(s8[16777216]{0})->s8[4194304]{0}}

ENTRY %main.1 (p0: s8[16777216], p1: bf16[7168,1536], p2: bf16[2048,4096]) -> s8[4194304] {
  %p0 = s8[16777216]{0:T(1024)(128)(4,1)} parameter(0)
  %p1 = bf16[7168,1536]{1,0:T(8,128)(2,1)} parameter(1)
  %p2 = bf16[2048,4096]{1,0:T(8,128)(2,1)} parameter(2)
  %slice-start.1 = ((s8[16777216]{0:T(1024)(128)(4,1)}), s8[4194304]{0:T(1024)(128)(4,1)S(1)}, s32[]{:S(2)}) slice-start(%p0), slice={[0:4194304]}
  %slice-start.2 = ((s8[16777216]{0:T(1024)(128)(4,1)}), s8[4194304]{0:T(1024)(128)(4,1)S(1)}, s32[]{:S(2)}) slice-start(%p0), slice={[4194304:8388608]}
  %slice-done.1 = s8[4194304]{0:T(1024)(128)(4,1)S(1)} slice-done(%slice-start.1)
  %slice-done.2 = s8[4194304]{0:T(1024)(128)(4,1)S(1)} slice-done(%slice-start.2)
  %copy-start.2 = (bf16[7168,1536]{1,0:T(8,128)(2,1)S(1)}, bf16[7168,1536]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%p1)
  %copy-done.2 = bf16[7168,1536]{1,0:T(8,128)(2,1)S(1)} copy-done(%copy-start.2)
  %slice.5 = bf16[2048,128]{1,0:T(8,128)(2,1)} slice(%p2), slice={[0:2048], [128:256]}
  ROOT %add.1 = s8[4194304]{0:T(1024)(128)(4,1)} add(%slice-done.1, %slice-done.2)
}
"""

COND = """\
HloModule jit_f

%region_0.1 (a: bf16[512,512]) -> bf16[512,512] {
  %a = bf16[512,512]{1,0:T(8,128)(2,1)} parameter(0)
  ROOT %exp.1 = bf16[512,512]{1,0:T(8,128)(2,1)} exponential(%a)
}

%region_1.2 (b: bf16[512,512]) -> bf16[512,512] {
  %b = bf16[512,512]{1,0:T(8,128)(2,1)} parameter(0)
  ROOT %neg.1 = bf16[512,512]{1,0:T(8,128)(2,1)} negate(%b)
}

ENTRY %main.2 (p: pred[], x: bf16[512,512]) -> bf16[512,512] {
  %p = pred[]{:T(512)} parameter(0)
  %x = bf16[512,512]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %cond.5 = bf16[512,512]{1,0:T(8,128)(2,1)} conditional(%p, %x, %x), branch_computations={%region_0.1, %region_1.2}, metadata={op_name="jit(f)/cond"}
}
"""


def test_async_copies_cost_the_bytes_they_move():
    program = hlo.program_ops(CHUNKED)
    ops = program.ops
    by_name = {op.name: op for op in ops}
    # a 4 MiB chunk into VMEM reads 4 MiB, not the 16 MiB operand and its tuple again
    assert by_name["slice-start.1"].hbm_bytes == by_name["slice-start.2"].hbm_bytes == 4 * MIB
    assert not any(op.opcode.endswith("-done") for op in ops)  # the ends move nothing
    # weights prefetched into VMEM: read once from HBM, no HBM write
    assert by_name["copy-start.2"].hbm_bytes == 7168 * 1536 * 2
    # an XLA-side slice reads its window, not the whole parameter
    assert by_name["slice.5"].hbm_bytes == 2 * 2048 * 128 * 2
    # the add reads its two chunks from VMEM: only its 4 MiB HBM output
    assert by_name["add.1"].hbm_bytes == 4 * MIB
    assert program.notes == program.unknown_trips == program.conditionals == []


def test_every_branch_of_a_conditional_is_priced_and_said():
    program = hlo.program_ops(COND)
    assert sorted(op.name for op in program.ops) == ["exp.1", "neg.1"]
    assert all(op.hbm_bytes == 2 * 512 * 512 * 2 for op in program.ops)
    assert program.conditionals == ["cond.5"] and program.unknown_trips == []
    assert program.notes == ["conditional cond.5: all 2 branches priced (an upper bound: one runs)"]
