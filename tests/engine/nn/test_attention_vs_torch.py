"""engine.nn.attention against PyTorch with the same weights: scaled_dot_product_attention
(every kind of mask), masked_fill, einsum's patterns, broadcasting matmul and softmax
over a middle axis: the eval forward, every parameter's gradient, the parameters after
SGD and Adam steps, exact memory and no allocation in a step; and the errors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine import nn
from engine.nn import attention
from engine.nn._tensor import masked_fill
from engine.nn.transformer import MultiheadAttention
from tests.engine.nn.attention_harness import compare_inputs, compile_forward
from tests.engine.nn.harness import close, compile_checked

torch = pytest.importorskip("torch", reason="PyTorch (pip install torch==2.13.0) is the reference")
tnn = torch.nn
TF = torch.nn.functional

R = np.random.default_rng(0)
B, L, S, E, H = 3, 5, 7, 8, 2
X = R.normal(size=(B, L, E)).astype(np.float32)
KV = R.normal(size=(B, S, E)).astype(np.float32)
KEEP = R.random((L, S)) < 0.6
KEEP[:, 0] = True  # every query keeps a key: no NaN row
BIAS = R.normal(size=(L, S)).astype(np.float32)

ENGINE = SimpleNamespace(L=nn, sdpa=attention.scaled_dot_product_attention,
                         einsum=attention.einsum, matmul=attention.matmul,
                         masked_fill=masked_fill, softmax=nn.functional.softmax, cat=nn.cat,
                         const=lambda a: a)
TORCH = SimpleNamespace(L=tnn, sdpa=TF.scaled_dot_product_attention, einsum=torch.einsum,
                        matmul=torch.matmul, masked_fill=lambda x, m, v: x.masked_fill(m, v),
                        softmax=TF.softmax, cat=torch.cat, const=torch.from_numpy)


def heads(x: Any) -> Any:
    """[b, n, E] as [b, H, n, E/H]."""
    return x.reshape(-1, x.shape[1], H, E // H).transpose(1, 2)


def sdpa_model(lib: Any, **kw: Any) -> Any:
    """Projections, then scaled_dot_product_attention of x against kv, masks given by
    keyword (``m`` an input of the forward when ``mask="input"``)."""

    class Attend(lib.L.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (lib.L.Linear(E, E) for _ in range(3))

        def forward(self, x: Any, kv: Any, m: Any = None) -> Any:
            args = dict(kw)
            if args.pop("mask", None) == "input":
                args["attn_mask"] = m
            elif "attn_mask" in args:
                args["attn_mask"] = lib.const(args["attn_mask"])
            out = lib.sdpa(heads(self.q(x)), heads(self.k(kv)), heads(self.v(kv)), **args)
            return out.flatten(1)

    return Attend()


PAD_KEEP = R.random((B, 1, L, S)) < 0.7
PAD_KEEP[..., 0] = True
SDPA_CASES: dict[str, tuple[dict[str, Any], dict[str, np.ndarray]]] = {
    "plain": ({}, {}),
    "scale": ({"scale": 0.3}, {}),
    "causal": ({"is_causal": True}, {}),
    "numpy-bool": ({"attn_mask": KEEP}, {}),
    "numpy-float": ({"attn_mask": BIAS}, {}),
    "input-bool": ({"mask": "input"}, {"m": PAD_KEEP}),
    "input-float": ({"mask": "input"},
                    {"m": R.normal(size=(B, 1, 1, S)).astype(np.float32)}),
}


@pytest.mark.parametrize("case", sorted(SDPA_CASES))
def test_sdpa_matches_pytorch(case: str) -> None:
    kw, extra = SDPA_CASES[case]
    torch.manual_seed(0)
    compare_inputs(torch, sdpa_model(TORCH, **kw), sdpa_model(ENGINE, **kw),
                   {"x": X, "kv": KV, **extra})


def test_sdpa_builds_no_transpose_and_one_score_product() -> None:
    """q k^T is one MatMulT (the transpose a flag), the scale applied to q."""
    g = nn.to_graph(sdpa_model(ENGINE), inputs={"x": (0, L, E), "kv": (0, S, E)}, loss=None)
    ops = [n.op for n in g.paths[0].nodes]
    assert ops.count("MatMulT") == 4 and ops.count("Softmax") == 1  # 3 Linear + scores
    assert ops.index("Mul") < ops.index("Softmax")


def test_fully_masked_row_is_nan_where_pytorch_gives_zero() -> None:
    """A query with every key masked: PyTorch's scaled_dot_product_attention (since
    2.5) gives zeros, the engine a NaN row (a plain softmax of -inf, as PyTorch's
    MultiheadAttention with need_weights=True); every other row is equal."""
    keep = KEEP.copy()
    keep[2] = False
    torch.manual_seed(0)
    tm, em = sdpa_model(TORCH, attn_mask=keep), sdpa_model(ENGINE, attn_mask=keep)
    em.load_state_dict(tm.state_dict())
    want = tm(torch.from_numpy(X), torch.from_numpy(KV)).detach().numpy()
    g = nn.to_graph(em, inputs={"x": (0, L, E), "kv": (0, S, E)}, loss=None)
    vm = compile_forward(g, B)
    vm.set("x", X)
    vm.set("kv", KV)
    with np.errstate(invalid="ignore"):
        vm.forward("eval")
    got = vm.get("logits").reshape(B, H, L, E // H)
    want = want.reshape(B, H, L, E // H)
    assert np.isnan(got[:, :, 2]).all() and (want[:, :, 2] == 0).all()
    assert not np.isnan(np.delete(got, 2, axis=2)).any()
    close(np.delete(got, 2, axis=2), np.delete(want, 2, axis=2))


# -- masked_fill, einsum, matmul, softmax -------------------------------------------------


FILL = R.random((L, E)) < 0.3


def fill_model(lib: Any, traced: bool) -> Any:
    class Fill(lib.L.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lib.L.Linear(E, E)

        def forward(self, x: Any, m: Any = None) -> Any:
            mask = m if traced else lib.const(FILL)
            return lib.masked_fill(self.lin(x), mask, -0.5).flatten(1)

    return Fill()


@pytest.mark.parametrize("traced", [False, True])
def test_masked_fill_matches_pytorch(traced: bool) -> None:
    torch.manual_seed(0)
    extra = {"m": R.random((B, L, E)) < 0.3} if traced else {}
    compare_inputs(torch, fill_model(TORCH, traced), fill_model(ENGINE, traced),
                   {"x": X, **extra})


def test_masked_fill_is_a_tensor_method() -> None:
    class M(nn.Module):
        def forward(self, x: Any) -> Any:
            return x.masked_fill(FILL, 2.0).flatten(1)

    g = nn.to_graph(M(), inputs={"x": (0, L, E)}, loss=None)
    vm = compile_forward(g, B)
    vm.set("x", X)
    vm.forward("eval")
    close(vm.get("logits"), torch.from_numpy(X).masked_fill(torch.from_numpy(FILL), 2.0)
          .flatten(1).numpy())


EINSUMS = {
    "bhld,bhmd->bhlm": lambda q, k, v, w: (q, k),
    "bhlm,bhmd->bhld": lambda q, k, v, w: (q.transpose(2, 3) * 0.5 + 0.1, v),
    "bld,de->ble": lambda q, k, v, w: (q.flatten(1, 2).reshape(-1, 2 * L, E // H), w),
    "de,bld->ble": lambda q, k, v, w: (w, q.flatten(1, 2).reshape(-1, 2 * L, E // H)),
    "bhld->blhd": lambda q, k, v, w: (q,),
    "bhld->bhl": lambda q, k, v, w: (q,),
    "bij->bji": lambda q, k, v, w: (q.flatten(1, 2),),
    "bi,bj->bij": lambda q, k, v, w: (q.flatten(1), v.flatten(1)),
    "bhld,bhmd->blm": lambda q, k, v, w: (q, k),
    "bhld,hde->bhle": lambda q, k, v, w: (q, w.reshape(H, E // H, 3)),
}


def einsum_model(lib: Any, equation: str) -> Any:
    class Ein(lib.L.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (lib.L.Linear(E, E) for _ in range(3))
            self.w = lib.L.Linear(6, E // H, bias=False)  # its weight [4, 6] an operand

        def forward(self, x: Any) -> Any:
            ops = EINSUMS[equation](heads(self.q(x)), heads(self.k(x)), heads(self.v(x)),
                                    self.w.weight)
            return lib.einsum(equation, *ops).flatten(1)

    return Ein()


@pytest.mark.parametrize("equation", sorted(EINSUMS))
def test_einsum_matches_pytorch(equation: str) -> None:
    torch.manual_seed(0)
    compare_inputs(torch, einsum_model(TORCH, equation), einsum_model(ENGINE, equation),
                   {"x": X}, optimizers=("adam",), steps=1)


def test_einsum_of_parameters_alone() -> None:
    """``ij->ji`` of a parameter (unbatched), added to a batched tensor."""

    class T(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(R.normal(size=(E, L)).astype(np.float32))

        def forward(self, x: Any) -> Any:
            return (x + attention.einsum("ij->ji", self.w)).flatten(1)

    g = nn.to_graph(T(), inputs={"x": (0, L, E)}, loss=None)
    vm = compile_forward(g, B)
    vm.set("x", X)
    vm.forward("eval")
    close(vm.get("logits"), (X + vm.get("w").T).reshape(B, -1))


def matmul_model(lib: Any) -> Any:
    class MM(lib.L.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = lib.L.Linear(E, E)
            self.w = lib.L.Linear(3, E, bias=False)  # weight [E, 3]: the broadcast operand

        def forward(self, x: Any, z: Any) -> Any:
            h = heads(self.a(x))  # [b, H, L, 4]
            one = lib.matmul(h, h.transpose(2, 3)[:, :1])  # [b,H,L,4] @ [b,1,4,L]
            two = lib.matmul(self.a(x), self.w.weight)  # [b, L, E] @ [E, 3]
            three = lib.matmul(h[:, :1], z)  # [b, 1, L, 4] @ [b, H, 4, 2]
            soft = lib.softmax(h * 2.0, dim=2)  # a middle axis
            return lib.cat([one.flatten(1), two.flatten(1), three.flatten(1),
                            soft.flatten(1)], 1)

    return MM()


def test_matmul_broadcasting_and_middle_softmax_match_pytorch() -> None:
    torch.manual_seed(0)
    z = R.normal(size=(B, H, E // H, 2)).astype(np.float32)
    compare_inputs(torch, matmul_model(TORCH), matmul_model(ENGINE), {"x": X, "z": z})


# -- memory ---------------------------------------------------------------------------------


def score_buffers(length: int, batch: int) -> list[int]:
    """Bytes at ``batch`` of every planned buffer shaped like the scores [b, H, n, n]."""

    class Self(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = MultiheadAttention(E, H, batch_first=True)

        def forward(self, x: Any) -> Any:
            return self.mha(x, x, x, need_weights=False)[0].flatten(1)

    g = nn.to_graph(Self(), inputs={"x": (0, length, E)}, loss=sum_loss_flat,
                    target_shape=(0, length * E))
    prog, _ = compile_checked(g, batch)
    found = []
    for b in prog.buffers:
        if b.shape == (0, H, length, length):
            n = b.desc.nbytes(batch)
            assert b.offset + n <= prog.zone_bytes[b.zone], b
            found.append(n)
    return found


def sum_loss_flat(out: Any, r: Any) -> Any:
    return (out * r).sum()


def test_scores_are_planned_and_grow_with_the_square_of_the_length() -> None:
    """The attention scores are ordinary planned buffers of batch*H*L*L*4 bytes: at
    twice the length each is four times the bytes, and the program has as many."""
    batch = 4
    short, long = score_buffers(6, batch), score_buffers(12, batch)
    assert short and len(short) == len(long)
    assert set(short) == {batch * H * 6 * 6 * 4}
    assert set(long) == {batch * H * 12 * 12 * 4}


# -- errors -------------------------------------------------------------------------------


def trace_error(forward: Any, inputs: dict[str, Any] | None = None) -> str:
    class M(nn.Module):
        def forward(self, x: Any) -> Any:
            return forward(x)

    with pytest.raises(nn.TraceError) as e:
        nn.to_graph(M(), inputs=inputs or {"x": (0, H, L, E)}, loss=None)
    return str(e.value)


def test_errors_name_what_is_wrong() -> None:
    sdpa = attention.scaled_dot_product_attention
    msg = trace_error(lambda x: sdpa(x, x, x, attn_mask=np.ones((L + 1, L), bool)).flatten(1))
    assert "attn_mask of shape (6, 5)" in msg and "test_attention_vs_torch.py" in msg
    msg = trace_error(lambda x: sdpa(x, x, x, attn_mask=np.ones((L, L), bool), is_causal=True))
    assert "not both" in msg
    msg = trace_error(lambda x: sdpa(x, x, x, attn_mask=np.ones((L, L), np.int64)))
    assert "bool or float" in msg
    msg = trace_error(lambda x: sdpa(x, x[..., :3], x))
    assert "last axis" in msg
    for eq, why in (("bhld,bhmd", "'->'"), ("...ld,bhmd->bhlm", "ellipsis"),
                    ("bhll->bhl", "repeated"), ("bhld,bhmd,bhmd->bhlm", "3 operand"),
                    ("bhld->hbld", "lead the output"), ("bhl->bhl", "3 letters")):
        msg = trace_error(lambda x, eq=eq: attention.einsum(eq, *([x] * eq.count(",")), x))
        assert f"einsum({eq!r})" in msg and why in msg, msg
    msg = trace_error(lambda x: masked_fill(x, np.ones((L, E), np.float32), 0.0))
    assert "must be bool" in msg
    msg = trace_error(lambda x: masked_fill(x, np.ones((3, 1), bool), 0.0))
    assert "does not broadcast" in msg
