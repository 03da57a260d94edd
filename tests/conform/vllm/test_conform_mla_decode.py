"""vLLM's Triton MLA decode over a paged cache (`mla-paged-decode`), under the interpreter, against the mla-backends
model: both metadata forms, page sizes 1/16/32/64, KV lengths 0, 1 and non-multiples of the page size.

The release is downloaded once into the user cache (a failed download fails these tests with pip's reason).
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets
from kvsim.conform.vllm.mla_decode import DECODE, NAME, LaunchTolerance, bf16, decode_rows
from kvsim.properties.mla_backends.cases import PagedCase

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def _run(source, n=4):
    return run_target(select_targets("vllm", NAME)[0], source, RunOptions(max_examples=n))


def test_the_release_kernel_conforms_and_empty_rows_are_nan():
    result = _run(resolve_source("vllm", version="0.33.0"))
    assert result.status == "conforms" and result.divergent == 0, result
    assert result.compared == 6 + 4  # the six pinned batches, then drawn ones
    assert result.properties == [{"property": "empty_row_is_nan", "status": "holds",
                                  "message": "a row of extent 0 is NaN output with LSE -inf in the release's kernel"}]


def _planted(tmp_path, line, old, new):
    """A tree holding 0.33.0's decode kernel file with `old` made `new` in its one `line`."""
    release = resolve_source("vllm", version="0.33.0")
    copy = tmp_path / DECODE
    copy.parent.mkdir(parents=True)
    text = release.file(DECODE).read_text()
    assert text.count(line) == 1
    copy.write_text(text.replace(line, line.replace(old, new)))
    (tmp_path / "vllm" / "__init__.py").write_text("")
    return resolve_source("vllm", from_path=str(tmp_path))


def test_a_kernel_that_drops_the_last_key_of_each_split_diverges(tmp_path):
    line = 'mask_h[:, None] & (offs_n[None, :] < split_kv_end), qk, float("-inf")'
    result = _run(_planted(tmp_path, line, "< split_kv_end", "< split_kv_end - 1"), n=2)
    assert result.status == "diverges" and result.divergent == 1, result
    found = result.divergences[0]
    # the first pinned batch the grouped kernel runs (the first has 1 head: the ungrouped kernel, not planted): the
    # prefill batch in 4 splits, each split's last key masked
    assert found["input"]["kv_lens"] == [65, 3] and found["input"]["num_kv_splits"] == 4, found
    assert found["field"].startswith(("output[", "lse[")), found


def test_a_head_mask_one_past_the_head_count_diverges_on_the_pinned_20_head_batch(tmp_path):
    """The mutation sample's one input gap: `cur_head < q_head_num` made `<=` in the grouped kernel changes nothing
    while the head count fits one head block (16, or a multiple of it); the pinned batch of 20 heads shows it. Its
    last row writes one head past the end of the output: into the row past it (`guarded`), counted, where it went
    into the kernel child's heap and crashed the child, or not, by chance (a CI run met the crash)."""
    result = _run(_planted(tmp_path, "mask_h = mask_h & (cur_head < q_head_num)", "<", "<="), n=1)
    assert result.status == "diverges" and result.divergent == 1, result
    found = result.divergences[0]
    assert found["input"]["heads"] == 20 and found["field"] == "past_end", found


def test_the_tolerance_is_the_launch_dtypes():
    compare = LaunchTolerance()
    want = {"dtype": "float16", "forms_agree": True, "output": np.ones(4, np.float32), "lse": np.zeros(2, np.float32)}
    near = dict(want, output=np.full(4, 1.002, np.float32))
    assert compare.difference(want, near) is None  # within fp16's rtol 1e-3 + atol 2e-3
    far = dict(want, output=np.full(4, 1.01, np.float32))
    assert compare.difference(want, far).path == "output[0]"
    assert compare.difference(dict(want, dtype="bfloat16"), dict(far, dtype="bfloat16")) is None  # bf16: 2e-2
    assert compare.difference(want, dict(want, forms_agree=False)).path == "forms_agree"


def test_causal_rows_get_forward_mqa_extents():
    table = ((4, 5), (7,))
    rows, extents = decode_rows(PagedCase(q_lens=(3, 1), kv_lens=(20, 2), page_size=16, seed=0, causal=True), table)
    assert extents == [18, 19, 20, 2] and rows == [[4, 5], [4, 5], [4, 5], [7, 0]]
    _, flat = decode_rows(PagedCase(q_lens=(2,), kv_lens=(1,), page_size=1, seed=0, causal=True), ((3,),))
    assert flat == [0, 1]  # the first row sees no key: extent 0 (a padding row upstream)
    _, plain = decode_rows(PagedCase(q_lens=(2,), kv_lens=(5,), page_size=16, seed=0), ((3,),))
    assert plain == [5, 5]


def test_bf16_rounding_is_torchs():
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 1e3
    x[:4] = [0.0, -0.0, 1.00390625, 1.01171875]  # ties to even, both ways
    assert np.array_equal(bf16(x), torch.from_numpy(x).to(torch.bfloat16).float().numpy())


def test_the_model_soft_caps_logits_as_the_kernel_does():
    """`logit_cap` (a parameter of `decode_attention_fwd` the model lacked): `cap * tanh(logit / cap)`."""
    from kvsim.models.mla_backends.merge import attention_state

    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((1, 1, 4)) * 4, rng.standard_normal((3, 4)) * 4, rng.standard_normal((3, 2))
    _, lse = attention_state(q, k, v, 1.0, logit_cap=2.0)
    logits = 2.0 * np.tanh((q[0, 0] @ k.T) / 2.0)
    assert np.isclose(lse[0, 0], np.log2(np.exp(logits).sum()), rtol=1e-6)
    assert not np.isclose(attention_state(q, k, v, 1.0)[1][0, 0], lse[0, 0])


def test_one_launch_carries_both_forms_rows_each_answered_apart():
    """Both metadata forms go to the kernel in one launch, the dense form's rows first; each form's answer is its
    own rows (the launch's rows numbered here by a stand-in child), its table rows padded with page 0 to the widest
    (the dense form's junk past the live pages kept)."""
    from types import SimpleNamespace

    from kvsim.conform.vllm.mla_decode import DecodeCase, launch
    from kvsim.gpu_oracle.runtime.asan import pack
    from kvsim.models.mla_backends.metadata import dense_from_csr
    from kvsim.properties.mla_backends.cases import PAGED_DECODE

    sent = []

    def call(runner, document):
        sent.append(document)
        numbered = np.arange(len(document["seq_lens"]), dtype=np.float32)
        return {"output": pack(numbered[:, None, None] * np.ones((1, 2, 128), np.float32)),
                "lse": pack(numbered[:, None] * np.ones((1, 2), np.float32))}

    ctx = SimpleNamespace(child=SimpleNamespace(call=call), options=SimpleNamespace(device="cpu"))
    (dense_out, dense_lse, dense_extents), (csr_out, _, csr_extents) = launch(ctx, DecodeCase(PAGED_DECODE, 2,
                                                                                             (128, 16)))
    assert dense_out[:, 0, 0].tolist() == [0, 1, 2] and csr_out[:, 1, 5].tolist() == [3, 4, 5]
    assert np.allclose(dense_lse[:, 0] * np.log(2.0), [0, 1, 2])
    assert dense_extents == csr_extents == [0, 1, 70] and sent[0]["seq_lens"] == [0, 1, 70] * 2
    metadata = PAGED_DECODE.metadata()
    dense, csr = metadata.dense().block_tables, dense_from_csr(metadata.csr(), PAGED_DECODE.alignment).block_tables
    width = max(len(r) for r in dense + csr)
    assert sent[0]["table"] == [list(r) + [0] * (width - len(r)) for r in dense + csr]
    assert dense != csr  # the forms differ past the live pages: the launch compares two tables
    assert len(sent[0]["q"]["shape"]) == 3 and sent[0]["q"]["shape"][0] == 6


def test_drawn_batches_are_small_and_still_take_every_kernel_shape():
    """The CI profile's 40 drawn inputs: each bounded for the interpreter (a row per request at MLA's tile or 16
    heads, at most two per request otherwise), and among them both kernels (1 head; 2 or 16), every tile, MLA's
    widths more than once, several splits and causal rows of one request at different extents."""
    from kvsim.conform.kernels import DEFAULT_EXAMPLES
    from kvsim.conform.vllm.mla_decode import WIDTHS, decode_cases
    from kvsim.engine.draws import derandomized_draws

    drawn = derandomized_draws(decode_cases(None), DEFAULT_EXAMPLES)
    for case in drawn:
        most = 1 if case.widths == WIDTHS[0] or case.paged.heads == 16 else 2
        assert max(case.paged.q_lens) <= most, case
    assert {c.paged.heads for c in drawn} == {1, 2, 16} and {c.widths for c in drawn} == set(WIDTHS)
    assert sum(c.widths == WIDTHS[0] for c in drawn) >= 3
    assert {c.num_kv_splits for c in drawn} == {1, 2, 3, 4}
    assert any(c.paged.causal and max(c.paged.q_lens) == 2 and max(c.paged.kv_lens) > 1 for c in drawn)
