"""engine.nn.transformer against PyTorch with the same weights: MultiheadAttention (masks
of every kind, need_weights, kdim/vdim, no bias), TransformerEncoder of two layers
(post- and pre-norm, relu and gelu, a final norm) and the positional encodings: the
eval forward, every parameter's gradient, the parameters after SGD and Adam steps,
exact memory and no allocation in a step; dropout in training only; and the errors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from engine import nn
from engine.nn.transformer import (
    LearnedPositionalEmbedding,
    MultiheadAttention,
    SinusoidalPositionalEncoding,
    TransformerEncoder,
    TransformerEncoderLayer,
    sinusoidal_table,
)
from tests.engine.nn.attention_harness import compare_inputs, compile_forward, engine_graph
from tests.engine.nn.harness import close, compile_checked, torch_state

torch = pytest.importorskip("torch", reason="PyTorch (pip install torch==2.13.0) is the reference")
tnn = torch.nn
# PyTorch's fused inference kernels (and nested tensors) are faster forms of the same
# math, with padded positions zeroed: compare against the reference path
torch.backends.mha.set_fastpath_enabled(False)

R = np.random.default_rng(0)
B, L, S, E, H = 3, 5, 4, 8, 2
X = R.normal(size=(B, L, E)).astype(np.float32)
PAD = np.zeros((B, L), bool)
PAD[0, 3:] = True
PAD[2, 1:3] = True
CAUSAL = np.triu(np.ones((L, L), bool), 1)  # True: not attended
ATTN_BOOL = R.random((L, L)) < 0.3
np.fill_diagonal(ATTN_BOOL, False)
ATTN_FLOAT = R.normal(size=(L, L)).astype(np.float32)
LIBS = {"engine": (nn, np.asarray), "torch": (tnn, torch.from_numpy)}


def mha_model(lib: str, ctor: dict[str, Any], call: dict[str, Any]) -> Any:
    """MultiheadAttention(E, H, batch_first=True, **ctor) over x (or x against kv, v),
    returning the output and, with need_weights, the weights (flattened, joined)."""
    L_, const = LIBS[lib]
    cat = nn.cat if lib == "engine" else torch.cat

    class Att(L_.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = L_.MultiheadAttention(E, H, batch_first=True, **ctor) \
                if lib == "torch" else MultiheadAttention(E, H, batch_first=True, **ctor)

        def forward(self, x: Any, kv: Any = None, v: Any = None, pad: Any = None) -> Any:
            kw = {k: const(v) if isinstance(v, np.ndarray) else v for k, v in call.items()}
            if pad is not None:
                kw["key_padding_mask"] = pad
            key = x if kv is None else kv
            out, w = self.mha(x, key, key if v is None else v, **kw)
            if w is None:
                return out.flatten(1)
            return cat([out.flatten(1), w.flatten(1)], 1)

    return Att()


MHA_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]]] = {
    "self": ({}, {"need_weights": False}, {}),
    "weights": ({}, {}, {}),
    "weights-per-head": ({}, {"average_attn_weights": False}, {}),
    "padding-bool": ({}, {"need_weights": False}, {"pad": PAD}),
    "padding-float": ({}, {}, {"pad": np.where(PAD, -2.0, 0.5).astype(np.float32)}),
    "causal": ({}, {"attn_mask": CAUSAL, "is_causal": True, "need_weights": False}, {}),
    "attn-bool": ({}, {"attn_mask": ATTN_BOOL}, {}),
    "attn-float": ({}, {"attn_mask": ATTN_FLOAT}, {}),
    "attn-bool-and-padding": ({}, {"attn_mask": ATTN_BOOL}, {"pad": PAD}),
    "no-bias": ({"bias": False}, {}, {}),
    "kdim-vdim": ({"kdim": 6, "vdim": 3}, {},
                  {"kv": R.normal(size=(B, S, 6)).astype(np.float32),
                   "v": R.normal(size=(B, S, 3)).astype(np.float32)}),
    "cross": ({}, {"need_weights": False}, {"kv": R.normal(size=(B, S, E)).astype(np.float32)}),
}


@pytest.mark.parametrize("case", sorted(MHA_CASES))
def test_multihead_attention_matches_pytorch(case: str) -> None:
    ctor, call, extra = MHA_CASES[case]
    torch.manual_seed(0)
    compare_inputs(torch, mha_model("torch", ctor, call), mha_model("engine", ctor, call),
                   {"x": X, **extra})


def test_parameters_and_inits_are_pytorchs() -> None:
    tm, em = tnn.MultiheadAttention(E, H), MultiheadAttention(E, H)
    assert [(k, tuple(v.shape)) for k, v in tm.state_dict().items()] == \
        [(k, v.shape) for k, v in em.state_dict().items()]
    assert em.in_proj_weight.init.method == "xavier_uniform"
    nn.manual_seed(0)
    w = MultiheadAttention(64, 4).state_dict()
    bound = math.sqrt(6 / (64 + 3 * 64))  # xavier over [3E, E], as PyTorch
    assert 0.9 * bound < np.abs(w["in_proj_weight"]).max() <= bound
    assert not w["in_proj_bias"].any() and not w["out_proj.bias"].any()
    assert np.abs(w["out_proj.weight"]).max() <= 1 / 8
    tk = tnn.MultiheadAttention(E, H, kdim=6, vdim=3)
    ek = MultiheadAttention(E, H, kdim=6, vdim=3)
    assert {k: tuple(v.shape) for k, v in tk.state_dict().items()} == \
        {k: v.shape for k, v in ek.state_dict().items()}


def test_is_causal_alone_makes_the_causal_mask() -> None:
    """PyTorch wants the mask with is_causal; the engine makes it when it is missing."""
    torch.manual_seed(0)
    tm = mha_model("torch", {}, {"attn_mask": CAUSAL, "need_weights": False})
    em = mha_model("engine", {}, {"is_causal": True, "need_weights": False})
    em.load_state_dict(torch_state(tm))
    want = tm(x=torch.from_numpy(X)).detach().numpy()
    vm = compile_forward(nn.to_graph(em, inputs={"x": (0, L, E)}, loss=None), B)
    vm.set("x", X)
    vm.forward("eval")
    close(vm.get("logits"), want)


def test_batch_first_false_on_unbatched_tensors() -> None:
    """[L, N, E] with a fixed N (no graph batch): transposed in and out."""
    torch.manual_seed(0)
    tm, em = tnn.MultiheadAttention(E, H), MultiheadAttention(E, H)
    em.load_state_dict(torch_state(tm))
    x = R.normal(size=(L, 2, E)).astype(np.float32)
    tx = torch.from_numpy(x)
    out, w = tm(tx, tx, tx)

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = em

        def forward(self, x: Any) -> Any:
            o, a = self.mha(x, x, x)
            return nn.cat([o.flatten(), a.flatten()], 0)

    vm = compile_forward(nn.to_graph(M(), inputs={"x": (L, 2, E)}, loss=None), 1)
    vm.set("x", x)
    vm.forward("eval")
    close(vm.get("logits"), np.concatenate([out.detach().numpy().ravel(),
                                            w.detach().numpy().ravel()]))


def encoder_model(lib: str, norm_first: bool, activation: str, final_norm: bool,
                  dropout: float = 0.0) -> Any:
    L_, _ = LIBS[lib]
    Layer, Encoder = ((tnn.TransformerEncoderLayer, tnn.TransformerEncoder) if lib == "torch"
                      else (TransformerEncoderLayer, TransformerEncoder))
    extra = {"enable_nested_tensor": False} if lib == "torch" else {}

    class Enc(L_.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = Layer(E, H, dim_feedforward=16, dropout=dropout, activation=activation,
                          batch_first=True, norm_first=norm_first)
            self.enc = Encoder(layer, 2, norm=L_.LayerNorm(E) if final_norm else None,
                               **extra)
            self.head = L_.Linear(E, 3)

        def forward(self, x: Any, pad: Any) -> Any:
            return self.head(self.enc(x, src_key_padding_mask=pad)).flatten(1)

    return Enc()


@pytest.mark.parametrize(("norm_first", "activation", "final_norm"),
                         [(False, "relu", False), (True, "gelu", True),
                          (False, "gelu", True), (True, "relu", False)])
def test_transformer_encoder_matches_pytorch(norm_first: bool, activation: str,
                                             final_norm: bool) -> None:
    torch.manual_seed(0)
    tm = encoder_model("torch", norm_first, activation, final_norm)
    em = encoder_model("engine", norm_first, activation, final_norm)
    assert list(torch_state(tm)) == list(em.state_dict())  # names and order
    compare_inputs(torch, tm, em, {"x": X, "pad": PAD})


def test_encoder_layers_are_deep_copies() -> None:
    layer = TransformerEncoderLayer(E, H, dim_feedforward=16, batch_first=True)
    enc = TransformerEncoder(layer, 3)
    w = [enc.layers[i].self_attn.in_proj_weight for i in range(3)]
    assert len({id(p) for p in w}) == 3 and all(p is not layer.self_attn.in_proj_weight
                                                 for p in w)
    nn.manual_seed(1)
    layer.state_dict()  # values drawn: the copies take them, as PyTorch's deepcopy
    enc = TransformerEncoder(layer, 2)
    sd = enc.state_dict()
    assert np.array_equal(sd["layers.0.linear1.weight"], sd["layers.1.linear1.weight"])


def test_dropout_is_active_in_training_only() -> None:
    """With dropout 0.5 the train path has a Dropout on the attention weights and after
    each block, and its loss differs from the eval path's; the eval path has none and
    matches PyTorch in eval mode."""
    torch.manual_seed(0)
    tm = encoder_model("torch", False, "relu", False, dropout=0.5)
    em = encoder_model("engine", False, "relu", False, dropout=0.5)
    em.load_state_dict(torch_state(tm))
    tm.eval()
    want = tm(torch.from_numpy(X), torch.from_numpy(PAD)).detach().numpy()
    g = engine_graph(em, {"x": X, "pad": PAD}, want.shape)
    train, ev = ([n.op for n in p.nodes] for p in g.paths)
    assert train.count("Dropout") == 2 * 4 and "Dropout" not in ev
    _, vm = compile_checked(g, B)
    vm.set("x", X)
    vm.set("pad", PAD)
    r = np.ones_like(want)
    vm.set("y", r)
    vm.forward("eval")
    close(vm.get("logits"), want)
    vm.forward("train")
    assert abs(float(vm.get("loss")) - float((want * r).sum())) > 1e-3


def test_learned_positional_embedding_matches_pytorch() -> None:
    class TorchPE(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = tnn.Parameter(torch.randn(10, E) * 0.02)

        def forward(self, x: Any) -> Any:
            return x + self.weight[: x.size(1)]

    def model(pe: Any, L_: Any) -> Any:
        class M(L_.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin, self.pe = L_.Linear(E, E), pe

            def forward(self, x: Any) -> Any:
                return self.pe(self.lin(x)).flatten(1)

        return M()

    torch.manual_seed(0)
    compare_inputs(torch, model(TorchPE(), tnn), model(LearnedPositionalEmbedding(10, E), nn),
                   {"x": X})


def test_sinusoidal_encoding_is_the_tutorials_table() -> None:
    d, n = 6, 50  # the tutorial's code (seq-first buffer [max_len, 1, d]) for d even
    position = torch.arange(n).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
    pe = torch.zeros(n, 1, d)
    pe[:, 0, 0::2] = torch.sin(position * div_term)
    pe[:, 0, 1::2] = torch.cos(position * div_term)
    close(sinusoidal_table(n, d), pe[:, 0].numpy(), tol=1e-6)

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pe = SinusoidalPositionalEncoding(E, max_len=16)

        def forward(self, x: Any) -> Any:
            return self.pe(x).flatten(1)

    vm = compile_forward(nn.to_graph(M(), inputs={"x": (0, L, E)}, loss=None), B)
    vm.set("x", X)
    vm.forward("eval")
    close(vm.get("logits"), (X + sinusoidal_table(L, E)).reshape(B, -1))
    assert M().state_dict() == {}


# -- errors -------------------------------------------------------------------------------


def trace_error(module: nn.Module, inputs: dict[str, Any]) -> str:
    with pytest.raises(nn.TraceError) as e:
        nn.to_graph(module, inputs=inputs, loss=None)
    return str(e.value)


class Call(nn.Module):
    def __init__(self, inner: nn.Module, **kw: Any) -> None:
        super().__init__()
        self.inner, self.kw = inner, kw

    def forward(self, x: Any, pad: Any = None) -> Any:
        kw = dict(self.kw)
        if pad is not None:
            kw["key_padding_mask"] = pad
        if isinstance(self.inner, MultiheadAttention):
            return self.inner(x, x, x, **kw)[0].flatten(1)
        return self.inner(x, **kw).flatten(1)


def test_errors_name_what_is_wrong() -> None:
    with pytest.raises(nn.NNError, match="embed_dim 10 must be divisible by num_heads 4"):
        MultiheadAttention(10, 4)
    with pytest.raises(nn.NNError, match="add_bias_kv"):
        MultiheadAttention(8, 2, add_bias_kv=True)
    with pytest.raises(nn.NNError, match="activation must be 'relu', 'gelu'"):
        TransformerEncoderLayer(8, 2, activation="swish")
    mha = MultiheadAttention(E, H, batch_first=True)
    msg = trace_error(Call(mha, attn_mask=np.zeros((L, L + 1), bool)), {"x": (0, L, E)})
    assert "attn_mask must be [L, S] = (5, 5), got (5, 6)" in msg
    assert "test_transformer_vs_torch.py" in msg
    msg = trace_error(Call(mha), {"x": (0, L, E), "pad": ((0, L + 1), "bool")})
    assert "key_padding_mask must be [batch, S] = ('batch', 5)" in msg
    msg = trace_error(Call(mha, key_padding_mask=np.zeros((B, L), bool)), {"x": (0, L, E)})
    assert "key_padding_mask" in msg and "traced" in msg
    msg = trace_error(Call(MultiheadAttention(E, H)), {"x": (0, L, E)})
    assert "batch_first=True" in msg
    msg = trace_error(Call(mha), {"x": (0, L, E + 1)})
    assert "query's last axis is 9, expected 8" in msg
    msg = trace_error(Call(LearnedPositionalEmbedding(4, E)), {"x": (0, L, E)})
    assert "sequence length 5 exceeds max_len 4" in msg
