"""A training step over two torch.distributed ranks (gloo, two processes) is the step one
process makes: the same loss, gradient norm, clip figures and adapter afterwards, for each kind
of loss (several mini-batches and epochs, so the old-policy pass and the clip act; GSPO with
trajectories spanning rows, whose means are taken over both ranks; a KL term) and for SFT --
each rank holding the whole model, or with the model sharded over the two (FSDP: each holds
half of every weight, and its checkpoint state gathers and scatters back whole)."""

import json
import os
import socket
from pathlib import Path

import pytest
import torch

import artsdk as art
from artsdk.testing import trajectory
from backends.local import fsdp
from backends.local.policy import Policy
from backends.local.shard import Shard
from backends.local.sft import SFTConfig, sft_step
from backends.local.trainer import Row, TrainConfig, train_step

CACHE = Path(os.environ.get("ARTSDK_CACHE") or Path.home() / ".cache" / "artsdk")
# bench/gpu_check.sh sets cuda: then each rank has a GPU of its own and the ranks meet over NCCL
ON_GPU = os.environ.get("ARTSDK_TEST_DEVICE", "cpu").startswith("cuda")
needs_two = pytest.mark.skipif(ON_GPU and torch.cuda.device_count() < 2, reason="two ranks need two GPUs (NCCL)")
# one worker runs the module (its fixtures run the ranks once for all its tests)
pytestmark = pytest.mark.xdist_group("distributed")


def device(rank: int = 0) -> str:
    return f"cuda:{rank}" if ON_GPU else "cpu"
CASES = {
    "cispo, 2 mini-batches x 2 epochs": {"loss": "cispo", "minibatches": 2, "epochs": 2},
    "grpo with a KL term, 3 mini-batches": {"loss": "grpo", "minibatches": 3, "beta": 0.1},
    "gspo, trajectories spanning rows": {"loss": "gspo", "minibatches": 2, "tokens_per_row": 24},
    "sft": {"sft": True},
}
ROW = 40  # tokens per packed row: every mini-batch has several rows to deal out


def groups(policy: Policy) -> list[art.Group]:
    """Four groups of four multi-turn answers with different lengths and rewards."""
    out = []
    for g in range(4):
        trajs = []
        for k in range(4):
            first = [{"role": "user", "content": f"question {g}"}]
            ids1 = [40 + 7 * g + k + j for j in range(3 + k)]
            second = [*first, {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]
            ids2 = [90 + g + j for j in range(2 + (k + g) % 3)]
            t = trajectory(calls=[[*first, {"role": "assistant", "content": "a"}],
                                  [*second, {"role": "assistant", "content": "b"}]], model=policy.spec.name)
            for call, prompt, ids in ((t.calls[0], first, ids1), (t.calls[1], second, ids2)):
                call.prompt_token_ids = policy.chat.prompt_ids(prompt)
                call.choices[0].token_ids = ids
                call.choices[0].logprobs = [-5.0 - 0.1 * j for j in range(len(ids))]
            t.reward = float(k % 3) + 0.1 * g
            trajs.append(t)
        out.append(art.Group(trajectories=trajs))
    return out


def step(case: str, shard: Shard, dtype: str = "float32") -> dict:
    """Build the tiny policy (same seed on every rank), train one step on the same groups."""
    settings = dict(CASES[case])
    torch.manual_seed(0)
    train = TrainConfig.build(TrainConfig(), {"learning_rate": 1e-2, "tokens_per_row": ROW,
                                              **{k: v for k, v in settings.items() if k != "sft"}})
    where = device(shard.rank)
    # sharded: loaded into memory, each rank's share then moved to its device
    policy = Policy(art.TrainableModel("dist", base_model="tiny"), cache=CACHE,
                    device="cpu" if shard.sharded else where, dtype=getattr(torch, dtype), train_config=train)
    if shard.sharded:
        fsdp.shard(policy, where)
    for g in policy.optimizer.param_groups:
        g["lr"] = train.learning_rate
    tk = policy.tokenizing(0)
    policy.model.set_adapter("policy")
    if settings.get("sft"):
        trajs = [t for g in groups(policy) for t in g]
        metrics = sft_step(policy.model, policy.optimizer, trajs, SFTConfig.build({"epochs": 2, "batch_size": 5, "learning_rate": 1e-2,
                                                                                   "tokens_per_row": ROW}, seed=0),
                           tk, device=where, shard=shard)
    else:
        metrics = train_step(policy.model, policy.optimizer, groups(policy), train, tk, device=where,
                             reference=policy.model.disable_adapter, shard=shard)
    result = {"metrics": metrics, "adapter": adapter_of(policy), **fsdp.held(policy.model)}
    if shard.sharded:  # the checkpoint's state, gathered whole, scattered into a fresh sharded model
        weights, state = fsdp.gather(policy.model, policy.optimizer)
        fresh = Policy(art.TrainableModel("dist", base_model="tiny"), cache=CACHE, device="cpu",
                       dtype=getattr(torch, dtype), train_config=TrainConfig(seed=1))
        fsdp.shard(fresh, where)
        assert adapter_of(fresh) != result["adapter"]
        fsdp.scatter(fresh.model, fresh.optimizer, weights, state)
        weights2, state2 = fsdp.gather(fresh.model, fresh.optimizer)
        result["round_trip"] = (all(torch.equal(weights[k], weights2[k]) for k in weights) and weights.keys() == weights2.keys()
                                and all(torch.equal(v, state2["state"][i][k]) for i, s in state["state"].items()
                                        for k, v in s.items()))
        result["optimizer_entries"] = len(state["state"])
    return result


def adapter_of(policy: Policy) -> list[float]:
    """The adapter's weights, whole (gathered from the ranks when sharded), in a fixed order."""
    weights, _ = fsdp.gather(policy.model, policy.optimizer)
    return torch.cat([weights[k].flatten() for k in sorted(weights)]).tolist()


def rank_main(rank: int, world: int, port: int, cases: list[tuple[str, str]], out: str, sharded: bool = False) -> None:
    """Train each (case, dtype) in turn in one process group; rank<r>-<i>.json for the i-th."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    if ON_GPU:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if ON_GPU else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    ghosts = 0
    make_ghost = Row.as_ghost

    def counted(row: Row) -> Row:  # how many turns of the lockstep were a ghost's
        nonlocal ghosts
        ghosts += 1
        return make_ghost(row)

    Row.as_ghost = counted
    try:
        for i, (case, dtype) in enumerate(cases):
            ghosts = 0
            result = step(case, Shard(rank, world, sharded=sharded), dtype)
            Path(out, f"rank{rank}-{i}.json").write_text(json.dumps({**result, "ghosts": ghosts}))
    finally:
        Row.as_ghost = make_ghost
        dist.destroy_process_group()


def ranks_of(out: Path, i: int = 0) -> list[dict]:
    return [json.loads((out / f"rank{r}-{i}.json").read_text()) for r in range(2)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """Every case trained by two ranks each holding the whole model, in one pair of processes."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("whole")
    mp.spawn(rank_main, args=(2, free_port(), [(case, "float32") for case in CASES], str(out)), nprocs=2, join=True)
    return out


@needs_two
@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_make_the_step_one_process_makes(case, whole):
    alone = step(case, Shard())
    ranks = ranks_of(whole, list(CASES).index(case))
    assert ranks[0]["adapter"] == ranks[1]["adapter"]  # the ranks agree exactly
    one, two, start = torch.tensor(alone["adapter"]), torch.tensor(ranks[0]["adapter"]), torch.tensor(step_zero_adapter())
    moved, apart = (one - start).abs(), (one - two).abs()
    assert moved.max() > 1e-3  # the step trained something
    # the same step up to the order of float additions (Adam magnifies that noise where a
    # gradient is near 0, so the bound is relative to how far the step moved the weights)
    assert apart.mean() < 1e-4 * moved.mean() and apart.max() < 1e-2 * moved.max(), (float(apart.mean()),
                                                                                      float(moved.mean()))
    m1, m2 = alone["metrics"], ranks[0]["metrics"]
    assert m1["rows"] >= 2 * m1["updates"] / CASES[case].get("epochs", 1)  # each rank had rows of its own
    keys = ["loss", "grad_norm", "tokens_trained", "updates", "rows"] + (
        [] if "sft" in CASES[case] else ["clip_fraction", "ratio_mean", "kl", "logprob_mismatch", "is_weight_mean"])
    for k in keys:
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), (k, m1[k], m2[k])
    if CASES[case].get("beta"):
        assert m1["kl"] > 0
    if CASES[case].get("epochs", 1) * CASES[case].get("minibatches", 1) > 1 and "sft" not in CASES[case]:
        assert m1["clip_fraction"] > 0 or abs(m1["ratio_mean"] - 1) > 1e-6  # later updates saw a moved ratio


def step_zero_adapter() -> list[float]:
    torch.manual_seed(0)
    policy = Policy(art.TrainableModel("dist", base_model="tiny"), cache=CACHE, device="cpu", dtype=torch.float32,
                    train_config=TrainConfig())
    return adapter_of(policy)


SHARDED = [(case, "float32") for case in CASES] + [("cispo, 2 mini-batches x 2 epochs", "bfloat16")]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """Every case trained by two sharded ranks, in one pair of processes (they start once)."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("sharded")
    mp.spawn(rank_main, args=(2, free_port(), SHARDED, str(out), True), nprocs=2, join=True)
    return out


@needs_two
@pytest.mark.parametrize("case", list(CASES))
def test_two_sharded_ranks_make_the_step_one_process_makes(case, sharded):
    """FSDP over two ranks: each holds about half of the model, and the step is the one-process
    step -- loss and gradient norm within 1e-5, the adapter up to float noise."""
    alone = step(case, Shard())
    ranks = ranks_of(sharded, SHARDED.index((case, "float32")))
    assert alone["rank_params_fraction"] == 1.0
    for r in ranks:
        assert 0.45 < r["rank_params_fraction"] <= 0.55, r["rank_params_fraction"]
        assert r["round_trip"] and r["optimizer_entries"] > 0
    assert ranks[0]["adapter"] == ranks[1]["adapter"]  # gathered whole, the same on both
    one, two, start = torch.tensor(alone["adapter"]), torch.tensor(ranks[0]["adapter"]), torch.tensor(step_zero_adapter())
    moved, apart = (one - start).abs(), (one - two).abs()
    assert moved.max() > 1e-3
    assert apart.mean() < 1e-4 * moved.mean() and apart.max() < 1e-2 * moved.max(), (float(apart.mean()),
                                                                                      float(moved.mean()))
    m1, m2 = alone["metrics"], ranks[0]["metrics"]
    for k in ("loss", "grad_norm"):
        assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-6), (k, m1[k], m2[k])
    keys = ["tokens_trained", "updates", "rows"] + (
        [] if "sft" in CASES[case] else ["clip_fraction", "ratio_mean", "kl", "logprob_mismatch", "is_weight_mean"])
    for k in keys:
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), (k, m1[k], m2[k])
    assert ranks[0]["ghosts"] == 0  # rank 0 is dealt the odd row of a mini-batch
    if case != "gspo, trajectories spanning rows":  # (its mini-batches are 24 rows each; the others have odd ones)
        assert ranks[1]["ghosts"] > 0  # rank 1 took ghost turns, and the step is still the same


@needs_two
def test_two_sharded_ranks_in_bf16_make_the_one_process_step(sharded):
    """The same in bf16 (base weights bf16, the adapter kept in float32 by peft: one shard unit
    holds both): the figures agree to bf16's precision, and the state gathers and scatters whole."""
    case = "cispo, 2 mini-batches x 2 epochs"
    alone = step(case, Shard(), "bfloat16")
    ranks = ranks_of(sharded, SHARDED.index((case, "bfloat16")))
    for r in ranks:
        assert 0.45 < r["rank_params_fraction"] <= 0.55 and r["round_trip"]
    # Where the CPU multiplies bf16 natively (avx512_bf16: oneDNN's bf16 kernels), a matmul's
    # rounding depends on the batch's shape, and each rank's batch is half the one process's: on
    # such a CPU the loss differed by 0.0043 (a mean of terms of either sign, each about 1 and
    # rounded to bf16's 2**-8), the gradient norm by 0.09%, the adapter by 0.9% of its move. With
    # oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2), as on a CPU without them, all were equal.
    # The bounds are a few of bf16's roundings; a gradient averaged over the ranks instead of
    # summed is off by half
    m1, m2 = alone["metrics"], ranks[0]["metrics"]
    assert m2["loss"] == pytest.approx(m1["loss"], abs=2**-6), (m1["loss"], m2["loss"])
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=2**-8), (m1["grad_norm"], m2["grad_norm"])
    one, two = torch.tensor(alone["adapter"]), torch.tensor(ranks[0]["adapter"])
    moved = (one - torch.tensor(step_zero_adapter())).abs()
    assert (one - two).abs().mean() < 0.03 * moved.mean()
