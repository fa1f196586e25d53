"""The plain-torch stand-ins for SGLang's CPU kernels (`sglang_plugin.cpu_ops`): each request's span of slots in the
request-to-token table, written from and read into the packed locations, request after request."""

import torch

from parallel_decoding.sglang_plugin.cpu_ops import assign_extend_cache_locs, assign_req_to_token_pool

POOL_ROWS = torch.tensor([3, 0, 5])
STARTS = torch.tensor([4, 0, 7])
ENDS = torch.tensor([6, 3, 7])  # 2, 3 and 0 slots
PACKED = torch.tensor([10, 11, 20, 21, 22, -1])  # past the spans: untouched


def test_new_locations_go_to_each_request_s_span():
    table = torch.zeros(6, 8, dtype=torch.int32)
    assign_req_to_token_pool(POOL_ROWS, table, STARTS, ENDS, PACKED, 8)
    expected = torch.zeros(6, 8, dtype=torch.int32)
    expected[3, 4:6] = torch.tensor([10, 11])
    expected[0, 0:3] = torch.tensor([20, 21, 22])
    assert torch.equal(table, expected)


def test_a_span_s_locations_are_read_back_in_the_same_order():
    table = torch.arange(48, dtype=torch.int32).view(6, 8)
    out = torch.full((6,), -1, dtype=torch.int64)
    assign_extend_cache_locs(POOL_ROWS, table, STARTS, ENDS, out, 8)
    assert out.tolist() == [28, 29, 0, 1, 2, -1]
