"""What ``sim.hlo`` charges the ops of an optimized HLO module, on text as libtpu writes it
(lines taken from real v6e compiles, trimmed): async copies by what they move, slices by
their window, every branch of a conditional, matmuls by their MXU work."""

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

# A 3x3 convolution, a batched matmul (XLA writes it as a window over the batch on an input
# dilated as many times: one tap per output), mixtral's x @ w_e for all experts (the experts
# as a window of 8 over a size-1 input dim padded 7 each side: one tap per output), a plain
# dot and an int8 matmul.
MATMULS = """\
HloModule jit_f

%fused_computation (param_0: bf16[3,3,64,128], param_1: bf16[8,32,32,64]) -> bf16[8,32,32,128] {
  %param_0 = bf16[3,3,64,128]{3,2,1,0:T(8,128)(2,1)} parameter(0)
  %param_1 = bf16[8,32,32,64]{3,2,1,0:T(8,128)(2,1)} parameter(1)
  ROOT %convolution.3 = bf16[8,32,32,128]{3,0,2,1:T(8,128)(2,1)S(1)} convolution(%param_1, %param_0), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}

%bitcast_fusion (bitcast_input: bf16[4,256,512]) -> bf16[4,256,512] {
  %bitcast_input = bf16[4,256,512]{2,1,0:T(8,128)(2,1)S(1)} parameter(0)
  ROOT %bitcast = bf16[4,256,512]{2,1,0:T(8,128)(2,1)} bitcast(%bitcast_input)
}

%fused_computation.2 (param_0.3: bf16[4,256,512], param_1.2: bf16[4,512,384]) -> bf16[4,256,384] {
  %param_0.3 = bf16[4,256,512]{2,1,0:T(8,128)(2,1)S(1)} parameter(0)
  %fusion.4 = bf16[4,256,512]{2,1,0:T(8,128)(2,1)} fusion(%param_0.3), kind=kLoop, calls=%bitcast_fusion
  %param_1.2 = bf16[4,512,384]{2,1,0:T(8,128)(2,1)S(1)} parameter(1)
  ROOT %convolution-base-dilated.1 = bf16[4,256,384]{2,1,0:T(8,128)(2,1)} convolution(%fusion.4, %param_1.2), window={size=4 stride=3 lhs_dilate=4}, dim_labels=0bf_0io->0bf
}

%fused_computation.7 (param_0.25: bf16[8,4096,14336], param_1.21: bf16[2,4096,4096]) -> bf16[2,4096,8,14336] {
  %param_1.21 = bf16[2,4096,4096,1]{2,1,3,0:T(8,128)(2,1)S(1)} parameter(1)
  %param_0.25 = bf16[8,4096,14336,1]{2,1,0,3:T(8,128)(2,1)} parameter(0)
  ROOT %convolution.3 = bf16[2,4096,8,14336]{3,1,2,0:T(8,128)(2,1)} convolution(%param_1.21, %param_0.25), window={size=1x8 pad=0_0x7_7 rhs_reversal=0x1}, dim_labels=0bf1_1io0->0b1f
}

%fused_computation.3 (param_0.4: s8[256,512], param_1.3: s8[512,256]) -> s32[256,256] {
  %param_0.4 = s8[256,512]{1,0:T(32,128)(4,1)S(1)} parameter(0)
  %param_1.3 = s8[512,256]{1,0:T(32,128)(4,1)S(1)} parameter(1)
  ROOT %convolution.1 = s32[256,256]{1,0:T(8,128)} convolution(%param_0.4, %param_1.3), dim_labels=bf_io->bf
}

ENTRY %main.2 (a0: bf16[8,32,32,64], a1: bf16[3,3,64,128], a2: bf16[4,256,512], a3: bf16[4,512,384], a4: s8[256,512], a5: s8[512,256], a6: f32[128,96], a7: bf16[2,4096,4096,1], a8: bf16[8,4096,14336,1]) -> bf16[8,32,32,128] {
  %a0 = bf16[8,32,32,64]{3,2,1,0:T(8,128)(2,1)} parameter(0)
  %a1 = bf16[3,3,64,128]{3,2,1,0:T(8,128)(2,1)} parameter(1)
  %a2 = bf16[4,256,512]{2,1,0:T(8,128)(2,1)} parameter(2)
  %a3 = bf16[4,512,384]{2,1,0:T(8,128)(2,1)} parameter(3)
  %a4 = s8[256,512]{1,0:T(32,128)(4,1)} parameter(4)
  %a5 = s8[512,256]{1,0:T(32,128)(4,1)} parameter(5)
  %a6 = f32[128,96]{1,0:T(8,128)} parameter(6)
  %a7 = bf16[2,4096,4096,1]{2,1,3,0:T(8,128)(2,1)} parameter(7)
  %a8 = bf16[8,4096,14336,1]{2,1,0,3:T(8,128)(2,1)} parameter(8)
  %fusion = bf16[8,32,32,128]{3,0,2,1:T(8,128)(2,1)} fusion(%a1, %a0), kind=kOutput, calls=%fused_computation
  %fusion.2 = bf16[4,256,384]{2,1,0:T(8,128)(2,1)} fusion(%a2, %a3), kind=kOutput, calls=%fused_computation.2
  %fusion.3 = s32[256,256]{1,0:T(8,128)} fusion(%a4, %a5), kind=kOutput, calls=%fused_computation.3
  %fusion.7 = bf16[2,4096,8,14336]{3,1,2,0:T(8,128)(2,1)} fusion(%a8, %a7), kind=kOutput, calls=%fused_computation.7
  %dot.1 = f32[128,128]{1,0:T(8,128)} dot(%a6, %a6), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  ROOT %tuple.2 = (bf16[8,32,32,128]{3,2,1,0:T(8,128)(2,1)}) tuple(%fusion)
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


def test_matmuls_count_the_mxu_work_they_do():
    flops = {op.name: op.flops for op in hlo.program_ops(MATMULS).ops}
    assert flops["fusion"] == 2 * (8 * 32 * 32 * 128) * (3 * 3 * 64)  # every output: 9 taps of 64 features
    assert flops["fusion.2"] == 2 * 4 * 256 * 384 * 512  # one batch per output, not the window's 4
    assert flops["fusion.7"] == 2 * (2 * 4096 * 8 * 14336) * 4096  # one expert per output, not the window's 8
    assert flops["dot.1"] == 2 * 128 * 128 * 96
    assert flops["fusion.3"] == 0  # int8: another peak; no bound from it
