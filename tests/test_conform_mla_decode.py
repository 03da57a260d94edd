"""vLLM's Triton MLA decode over a paged cache (`mla-paged-decode`), under the interpreter, against the mla-backends
model: both metadata forms, page sizes 1/16/32/64, KV lengths 0, 1 and non-multiples of the page size.

The release is downloaded once into the user cache (a failed download fails these tests with pip's reason).
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, targets
from kvsim.conform.triton_child import KernelChild
from kvsim.conform.vllm.mla_decode import (DECODE, NAME, DecodeCase, bf16, decode_compare, decode_rows,
                                           empty_row_probe)
from kvsim.properties.mla_backends.cases import PAGED_DECODE, PagedCase

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def test_the_release_kernel_conforms_and_empty_rows_are_nan():
    (target,) = [t for t in targets("vllm") if t.name == NAME]
    result = target.run(resolve_source("vllm", version="0.33.0"), RunOptions(max_examples=4))
    assert result.status == "conforms" and result.divergent == 0, result
    assert result.compared >= 2 + 4  # the two pinned batches, then drawn ones
    assert result.properties == [{"property": "empty_row_is_nan", "status": "holds",
                                  "message": "a row of extent 0 is NaN output with LSE -inf in the release's kernel"}]


def test_a_kernel_that_drops_the_last_key_of_each_split_diverges(tmp_path):
    release = resolve_source("vllm", version="0.33.0")
    copy = tmp_path / DECODE
    copy.parent.mkdir(parents=True)
    text = release.file(DECODE).read_text()
    line = 'mask_h[:, None] & (offs_n[None, :] < split_kv_end), qk, float("-inf")'
    assert text.count(line) == 1
    copy.write_text(text.replace(line, line.replace("< split_kv_end", "< split_kv_end - 1")))
    (tmp_path / "vllm" / "__init__.py").write_text("")
    with KernelChild(resolve_source("vllm", from_path=str(tmp_path)), "cpu") as child:
        found = decode_compare(child, DecodeCase(PAGED_DECODE, 2))
        assert found is not None and "live rows beyond rtol 0.001 / atol 0.002 (float16)" in found.note
        # request 1 has one key: its only key masked, the row is empty (NaN) and so is beyond tolerance
        assert found.model.startswith("paged_mla_attention row 1:")
        with KernelChild(release, "cpu") as good:
            assert decode_compare(good, DecodeCase(PAGED_DECODE, 2)) is None
            assert empty_row_probe(good) is None


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
