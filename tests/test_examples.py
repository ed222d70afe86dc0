"""The examples: game engines and generators, offline reward tests on hand-made
trajectories, and a short end-to-end run of each with the tiny model."""

import json
import re

import pytest

import artsdk as art
from artsdk.testing import trajectory
from tests.conftest import needs_vllm, on_vllm
from examples.email_agent import agent as email
from examples.email_agent.inbox import Question
from examples.game_2048 import agent as g2048
from examples.game_2048.game import Board, board_value, tile_reward
from examples.temporal_clue import agent as clue
from examples.temporal_clue.puzzle import generate, parse_answer, score
from examples.tic_tac_toe import agent as ttt
from examples.tic_tac_toe.game import Game, opponent_move, winner_of

pytestmark = pytest.mark.anyio


def convo(answer, question="your move"):
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


# -- tic-tac-toe ----------------------------------------------------------------------------

def test_tic_tac_toe_rules_and_minimax():
    import random

    assert winner_of(tuple("XXXOO....")) == "x"
    assert winner_of(tuple("XOXXOOOXX")) == "draw"
    assert winner_of(tuple("X........")) is None
    g = Game(opponent="minimax", board=list("XX.OO...."))
    assert opponent_move(g, random.Random(0)) == "B3"  # takes its own win before blocking
    g = Game(opponent="minimax", board=list("XX..O...."))
    assert opponent_move(g, random.Random(0)) == "A3"  # must block
    assert ttt.parse_move("I play b2.") == "B2" and ttt.parse_move("A2B3") == "A2"
    assert ttt.parse_move("the middle") is None


def test_tic_tac_toe_blocker_threats_and_the_scripted_player_that_wins_and_blocks():
    import random

    from examples.tic_tac_toe.baselines import first_free, win_block_centre

    g = Game(opponent="blocker", board=list("XX.OO...."))
    assert opponent_move(g, random.Random(0)) == "B3"  # its own win first
    g = Game(opponent="blocker", board=list("XX..O...."))
    assert opponent_move(g, random.Random(0)) == "A3"  # else it blocks
    assert g.threats() == "You can win at A3.\n"
    g = Game(board=list("X...OO..X"))
    assert g.threats() == "O threatens to win at B1.\n" and Game().threats() == ""
    # the script takes its win, else blocks, else the centre
    assert win_block_centre(Game(board=list("XX.OO....")), random.Random(0)) == "A3"
    assert win_block_centre(Game(board=list("X...OO..X")), random.Random(0)) == "B1"
    assert win_block_centre(Game(board=list("X........")), random.Random(0)) == "B2"
    assert first_free(Game(board=list("X...OO..X")), random.Random(0)) == "A2"


def test_tic_tac_toe_rewards():
    win = trajectory(convo("B2"), outcome={"winner": "x", "invalid": None, "moves": ["B2", "A1", "C3"]})
    draw = trajectory(convo("B2"), outcome={"winner": "draw", "invalid": None, "moves": ["B2"] * 5})
    loss = trajectory(convo("B2"), outcome={"winner": "o", "invalid": None, "moves": ["B2", "A1"]})
    bad = trajectory(convo("banana"), outcome={"winner": None, "invalid": "banana", "moves": []})
    assert [ttt.result(t) for t in (win, draw, loss, bad)] == [1.0, 0.5, 0.0, -0.5]
    assert ttt.legal_moves(draw) == 1.0 and ttt.legal_moves(bad) == 0.0
    # per move: the share of chances (a win to take, else a loss to block) taken; 1 where none arose
    missed = trajectory(convo("A1"), outcome={"winner": "o", "invalid": None, "moves": ["A1"], "chances": 2,
                                              "taken": 1})
    assert ttt.tactics(missed) == 0.5 and ttt.tactics(win) == 1.0


async def test_tic_tac_toe_rollout_counts_its_chances(art_store, monkeypatch):
    """The rollout sees the threats spelled out and counts the chances it took, as the scripted
    baseline's outcome does for the same game."""
    from openai import AsyncOpenAI

    from artsdk.testing.mock_server import MockServer
    from examples.tic_tac_toe.baselines import play_with, win_block_centre

    game = Game(seed=3, opponent="blocker")
    scripted = play_with(win_block_centre, game)
    moves = iter(scripted["moves"])
    seen = []

    def script(messages):
        seen.append(messages[-1]["content"])
        return next(moves)

    with MockServer(script=script) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="k") as client:
            monkeypatch.setattr(ttt, "client", client)
            traj = await ttt.play.collect(game, temperature=0.0)
    assert traj.outcome == scripted and scripted["chances"] >= 1
    assert any("O threatens to win at" in s or "You can win at" in s for s in seen)


async def test_the_demonstrators_conversations_are_what_the_agent_is_asked(monkeypatch):
    """The warm-up and the control train on the demonstrator's moves (a random legal one), each
    asked exactly as the rollout asks it: a rollout playing those moves sends those prompts."""
    from openai import AsyncOpenAI

    from artsdk.testing.mock_server import MockServer
    from examples.game_2048.train import scripted as scripted_2048
    from examples.tic_tac_toe.train import make_scenarios, scripted

    cfg = {"opponent": "blocker", "turns": 6}
    game = make_scenarios(1, 5, cfg)[0]
    shown = scripted([game], cfg)
    assert {c["messages"][-1]["content"] for c in shown} <= set(ttt.CELLS) and len(shown) >= 3
    for module, convs, run in ((ttt, shown, lambda: ttt.play.collect(game, temperature=0.0)),
                               (g2048, scripted_2048([art.Args(7, turns=6)], cfg),
                                lambda: g2048.play.collect(7, turns=6, temperature=0.0))):
        answers = iter(c["messages"][-1]["content"] for c in convs)
        with MockServer(script=lambda messages: next(answers)) as server:
            async with AsyncOpenAI(base_url=server.base_url, api_key="k") as client:
                monkeypatch.setattr(module, "client", client)
                traj = await run()
        assert [c.messages for c in traj.calls] == [c["messages"][:-1] for c in convs]
        assert traj.outcome["invalid"] is None


# -- 2048 -----------------------------------------------------------------------------------

def test_2048_engine():
    b = Board(cells=[2, 2, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2])
    b.move("left")
    assert b.rows()[0] == [4, 8, 0, 0] and b.score == 12
    full = Board(cells=[2, 4, 2, 4, 4, 2, 4, 2, 2, 4, 2, 4, 4, 2, 4, 2])
    assert full.over and full.legal() == []
    with pytest.raises(ValueError, match="does not move"):
        Board(cells=[2, 0, 0, 0] + [0] * 12).move("left")
    assert Board(seed=3).cells == Board(seed=3).cells  # seeded
    assert tile_reward(2048) == 1.0 and tile_reward(2) == pytest.approx(1 / 11)
    assert g2048.parse_direction("I'd go Left!") == "left" and g2048.parse_direction("north") is None
    # the moves spelled out: those that merge, those that only slide; one that changes nothing left out
    b = Board(cells=[2, 2, 0, 0] + [4, 0, 0, 0] + [0] * 8)
    assert [b.merges(d) for d in ("up", "down", "left", "right")] == [0, 0, 1, 1]
    # up moves nothing
    assert b.options() == "Moves that merge tiles: left, right.\nMoves that only slide tiles: down.\n"
    assert Board(cells=[2, 4] + [0] * 14).options() == "Moves that only slide tiles: down, right.\n"


def test_2048_scripted_players_and_the_rollout_count_merges(monkeypatch):
    import asyncio
    import random

    from openai import AsyncOpenAI

    from artsdk.testing.mock_server import MockServer
    from examples.game_2048.baselines import merge_first, play_with, random_move

    b = Board(cells=[2, 0, 0, 0] + [2, 4, 0, 0] + [0] * 8)
    assert merge_first(b, random.Random(0)) == "up" and random_move(b, random.Random(0)) in b.legal()
    scripted = play_with(merge_first, 7, 6)
    assert scripted["chances"] >= 1 and scripted["merged"] == scripted["chances"]
    moves, seen = iter(scripted["moves"]), []

    def script(messages):  # a model answering as the script does, in a sentence
        seen.append(messages[-1]["content"])
        return f"You slide {next(moves)}."

    async def play(url):
        async with AsyncOpenAI(base_url=url, api_key="k") as client:
            monkeypatch.setattr(g2048, "client", client)
            return await g2048.play.collect(7, turns=6, temperature=0.0)

    with MockServer(script=script) as server:
        traj = asyncio.run(play(server.base_url))
    assert traj.outcome == scripted and "Moves that merge tiles: " in seen[0]


def test_2048_rewards():
    good = trajectory(convo("left"), outcome={"max_tile": 64, "cells": [64, 32] + [0] * 14, "moves": ["left"],
                                              "invalid": None})
    bad = trajectory(convo("north"), outcome={"max_tile": 2, "cells": [2, 2] + [0] * 14, "moves": [],
                                              "invalid": "north"})
    assert g2048.largest_tile(good) == pytest.approx(6 / 11)
    assert g2048.board(good) == pytest.approx(board_value([96]))
    assert g2048.invalid_move(bad) == -0.5 and g2048.invalid_move(good) == 0.0
    # per move: the share of turns that merged, of those where some move could; 1 where none could
    half = trajectory(convo("up"), outcome={**good.outcome, "chances": 4, "merged": 2})
    assert g2048.merging(half) == 0.5 and g2048.merging(good) == 1.0


# -- Temporal Clue --------------------------------------------------------------------------

@pytest.mark.parametrize("size", [3, 4])
def test_every_puzzle_has_exactly_one_solution_and_no_idle_clue(size):
    from examples.temporal_clue.puzzle import solutions

    for seed in range(60):
        p = generate(seed, size=size)
        assert solutions(p, p.rules) == [p.solution], seed
        for i in range(len(p.rules)):  # every clue is needed
            assert len(solutions(p, p.rules[:i] + p.rules[i + 1:])) > 1, (seed, p.clues[i])
        assert generate(seed, size=size).clues == p.clues  # seeded


def test_clue_parsing_and_reward():
    p = generate(7, size=3)
    right = "WHO: {}\nWEAPON: {}\nROOM: {}\nTIME: {}".format(*p.solution)
    assert score(p, right) == 1.0
    assert score(p, right.replace(p.solution[2], "nowhere")) == 0.75
    assert score(p, "the butler did it") == 0.0
    assert parse_answer("who: Alice.\nTime: 9pm") == {"suspect": "alice", "time": "9pm"}
    t = trajectory(convo(right), outcome={"score": 1.0, "parsed": parse_answer(right)})
    assert clue.correct(t) == 1.0 and clue.answer_format(t) == 1.0
    half = trajectory(convo("WHO: x\nROOM: y"), outcome={"score": 0.0, "parsed": parse_answer("WHO: x\nROOM: y")})
    assert clue.correct(half) == 0.0 and clue.answer_format(half) == 0.5


# -- email agent ----------------------------------------------------------------------------

def test_inbox_and_tools():
    inbox = email.inbox()
    assert inbox.count() >= 2000
    qs = email.questions()
    assert len(qs) >= 100 and len({q.question + q.mailbox for q in qs}) == len(qs)
    q = qs[5]
    body = inbox.read(q.source)["body"]
    assert q.answer in body
    hits = inbox.search([w.strip("?") for w in q.question.split()[-2:]], mailbox=q.mailbox)
    assert any(h["id"] == q.source for h in hits)
    assert inbox.search(["zzzz-no-such-word"]) == [] and inbox.read(10**9) is None


def _email_traj(answer, sources=(), found=(), read=(), turns=2, q=None, tool_calls=0):
    q = q or Question(0, "ana", "How much is invoice INV-1?", "$10.00", 7)
    return trajectory(convo(answer or "", q.question), scenario={"q": q.__dict__},
                      outcome={"answer": answer, "sources": list(sources), "found": list(found),
                               "read": list(read), "turns": turns, "tool_calls": tool_calls})


def test_email_rewards():
    assert email.correct(_email_traj("It is $10.00", sources=[7])) == 1.0
    assert email.correct(_email_traj("It is $10.00", sources=[3])) == 0.7
    assert email.correct(_email_traj("I don't know")) == 0.0
    assert email.correct(_email_traj("$99.00")) == -0.5  # wrong is worse than admitting it
    assert email.correct(_email_traj(None)) == 0.0
    assert email.progress(_email_traj("x", found=[7, 8], read=[7])) == pytest.approx(0.2)
    assert email.progress(_email_traj("x", found=[7])) == pytest.approx(0.1)
    assert email.turns(_email_traj("x", turns=6)) == pytest.approx(-0.06)
    assert email.tool_use(_email_traj("x", tool_calls=2)) == 0.1 and email.tool_use(_email_traj("x")) == 0.0


def test_email_baselines_and_split():
    from examples.email_agent import train as email_train
    from examples.email_agent.baselines import BASELINES

    held, warm, rl = email_train.split(email.questions())
    assert not {q.id for q in held} & {q.id for q in warm + rl} and not {q.id for q in warm} & {q.id for q in rl}
    assert {q.id for q in email_train.make_scenarios(16, 10_000, {})} <= {q.id for q in held}
    assert {q.id for q in email_train.make_scenarios(16, 3, {})} <= {q.id for q in rl}
    scripted, idk = BASELINES["search, read the top hit, copy (scripted)"], BASELINES["always \"I don't know\""]
    right = [email.is_correct(scripted(q)["answer"], q.answer) for q in held]
    assert sum(right) >= 0.9 * len(held)  # the rule the warm-up teaches finds nearly every answer
    assert all(idk(q)["answer"] == "I don't know" for q in held[:5])


async def test_email_warmup_conversations_are_what_the_agent_sees(monkeypatch):
    """A model answering as the scripted researcher leaves, in the agent's own calls, exactly
    the conversation the warm-up trains on: SFT and the rollout agree token for token."""
    from openai import AsyncOpenAI

    from artsdk.testing.mock_server import MockServer
    from examples.email_agent import train as email_train
    from examples.email_agent.baselines import warmup_conversations

    q = email_train.split(email.questions())[1][0]
    (conversation,) = warmup_conversations([q])
    said = [m for m in conversation["messages"] if m["role"] == "assistant"]

    def script(messages):  # the n-th answer of the conversation, for the n-th request
        return said[sum(m["role"] == "assistant" for m in messages)]

    with MockServer(script=script) as server:
        client = AsyncOpenAI(base_url=server.base_url, api_key="k")
        monkeypatch.setattr(email, "client", client)
        t = await email.research.collect(q)
        await client.close()
    assert t.outcome["answer"] == q.answer and t.outcome["sources"] == [q.source] and t.outcome["turns"] == 3
    assert email.correct(t) == 1.0 and email.progress(t) == pytest.approx(0.2)
    assert [c.tools for c in t.calls] == [email.TOOLS] * 3 == [conversation["tools"]] * 3
    assert t.calls[-1].messages == conversation["messages"][:-1]


async def test_email_judge_scores_research_relative_to_each_other():
    from artsdk.testing.mock_server import MockServer

    asked = []

    def script(messages):  # a judge preferring the candidate that answered, and saying why
        if "candidate" not in str(messages[0].get("content", "")).lower():
            return None
        asked.append(messages)
        return json.dumps({"scores": [{"candidate": 1, "score": 0.1, "reason": "no source"},
                                      {"candidate": 2, "score": 0.9, "reason": "cited"}]})

    with MockServer(script=script) as judge_server:
        judge = email.judged("judge-model", base_url=judge_server.base_url)
        group = [_email_traj("maybe $10", turns=3), _email_traj("$10.00 (email 7)", sources=[7])]
        group = await art.replay.rescore(group, [*email.REWARDS, judge], groups=False)
    assert [t.rewards["judge"] for t in group] == [0.1, 0.9] and judge.weight == 0.5
    assert len(asked) == 1 and any(email.JUDGE_TASK in m["content"] for m in asked[0])
    assert [c.params.get("judge") for c in group[0].calls][-1] == "judge"  # kept, never trained


# -- every example end to end with the tiny model --------------------------------------------

# every example on the built-in engine; on vLLM the email agent (several turns, tool calls): what
# the engine does is the same for every example, and each vLLM start costs a minute
@pytest.mark.parametrize("name, engine", [*((n, "builtin") for n in ("tic_tac_toe", "game_2048", "temporal_clue",
                                                                   "email_agent", "reviews")),
                                          pytest.param("email_agent", "vllm", marks=[needs_vllm, on_vllm])])
async def test_example_trains_end_to_end(name, engine, art_store, tmp_path, monkeypatch):
    import importlib

    from openai import AsyncOpenAI

    from examples.runner import load_config, train

    # the example's client, as in the example, but this test's own: an async client's
    # connections belong to the event loop they were made in
    agent_module = importlib.import_module(f"examples.{name}.agent")
    client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")
    monkeypatch.setattr(agent_module, "client", client)
    example = importlib.import_module(f"examples.{name}.train").EXAMPLE

    @art.reward(weight=1e-6)
    def first_token(t: art.Trajectory) -> float:
        # the tiny model's answers all score alike on the example's own rewards (and run to
        # max_tokens): this gives the groups a difference to learn from, so every step trains
        return float(next((c.choices[0].token_ids[0] for c in t.calls if c.choices and c.choices[0].token_ids), 0))

    cfg = load_config(example.config, ["--steps", "2", "--base-model", "tiny", "--eval-games", "2",
                                       "--scenarios-per-step", "2", "--group-size", "2"])
    # a short warm-up where the example has one; the held-out curve; no dynamic sampling (a tied
    # group would draw more games than the count below: its own test has rewards that tie on purpose)
    cfg.update(warmup=2, eval_every=1, dynamic_sampling=0)
    art.configure(backend_options={"device": "cpu", "home": str(tmp_path / "home"), "engine": engine})
    rewards = [*(example.rewards_for(cfg) if example.rewards_for else example.rewards), first_token]
    result = await train(cfg, example.rollout, rewards, example.make_scenarios, success=lambda t: True,
                         warmup=example.warmup)
    warm = 1 if example.warmup else 0
    assert [h["step"] for h in result["history"]] == list(range(1, 3 + warm))
    assert [h.get("sft", False) for h in result["history"]] == [True] * warm + [False] * 2
    assert [e["step"] for e in result["evals"]] == list(range(1, 3 + warm))  # after the warm-up, step 1, the end
    assert result["eval_scenarios"] == 2 and result["solved_before"] == 1.0
    assert ("after_warmup" in result) == bool(warm)
    # each held-out scenario's reward, for paired figures (bench/stats.py)
    assert set(result["each"]) == ({"before", "warmup", "after"} if warm else {"before", "after"})
    assert len(result["each"]["after"]["rewards"]) == 2
    assert sum(result["each"]["after"]["rewards"]) / 2 == pytest.approx(result["after"])
    project = cfg["project"]
    trajs = art_store.trajectories(project=project)
    assert len(trajs) == 2 + 2 * warm + 2 * 4 + 2 + 2  # eval, after warm-up, two steps of 2x2, eval at step 1, eval
    assert all(t.calls and t.reward is not None for t in trajs if t.error is None)
    assert all(c.choices and c.choices[0].trainable for t in trajs for c in t.calls), [c.error for t in trajs for c in t.calls if c.error][:3]
    if "temperature" in example.rollout.signature.parameters:  # evaluations greedy (or at the config's
        # eval_temperature), training at the config's temperature
        assert ({c.params.get("temperature") for t in trajs for c in t.calls}
                == {cfg.get("eval_temperature", 0.0), cfg.get("temperature", 1.0)})
    assert art_store.steps(project, cfg["model"])[-1]["step"] == 2 + warm
    json.dumps([t.outcome for t in trajs])  # outcomes are plain JSON
    await client.close()


@pytest.mark.parametrize("name", ["temporal_clue", "email_agent", "tic_tac_toe", "game_2048"])
async def test_a_control_run_trains_the_scripted_answers_to_the_same_scenarios(name, art_store, tmp_path, monkeypatch):
    """--control sft: after the same warm-up, each step is supervised on the scripted player's
    answers to the scenarios GRPO would have drawn; nothing is gathered for training."""
    import importlib

    from openai import AsyncOpenAI

    from examples import streams
    from examples.runner import load_config, train

    agent_module = importlib.import_module(f"examples.{name}.agent")
    client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")
    monkeypatch.setattr(agent_module, "client", client)
    example = importlib.import_module(f"examples.{name}.train").EXAMPLE
    cfg = load_config(example.config, ["--steps", "2", "--base-model", "tiny", "--eval-games", "2",
                                       "--scenarios-per-step", "2", "--control", "sft", "--warmup", "2"])
    art.configure(backend_options={"device": "cpu", "home": str(tmp_path / "home")})
    shown = []
    scripted = example.scripted

    def spy(scenarios, c):
        shown.append(scenarios)
        return scripted(scenarios, c)

    result = await train(cfg, example.rollout, example.rewards, example.make_scenarios, warmup=example.warmup,
                         scripted=spy)
    assert result["control"] == "sft"
    assert [(h["step"], h.get("sft"), h.get("control", False)) for h in result["history"]] == \
        [(1, True, False), (2, True, True), (3, True, True)]
    held = streams.held_out(example.make_scenarios, cfg)
    assert [list(map(streams.key, x)) for x in shown] == [
        list(map(streams.key, streams.training(example.make_scenarios, 2, 0, step, cfg, held))) for step in (1, 2)]
    trajs = art_store.trajectories(project=cfg["project"])
    assert len(trajs) == 2 * 3  # evaluations only (before, after the warm-up, after): no rollout was trained
    assert art_store.steps(cfg["project"], cfg["model"])[-1]["step"] == 3
    await client.close()


async def test_dynamic_sampling_fills_each_step_with_groups_that_differ(art_store, tmp_path, monkeypatch):
    """dynamic_sampling = k: a step draws on from its own stream (its usual scenarios first) until
    scenarios_per_step groups have rewards that differ; the tied ones are stored, not trained."""
    import importlib

    from openai import AsyncOpenAI

    from examples import streams
    from examples.runner import load_config, train

    agent_module = importlib.import_module("examples.tic_tac_toe.agent")
    client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")
    monkeypatch.setattr(agent_module, "client", client)
    example = importlib.import_module("examples.tic_tac_toe.train").EXAMPLE

    @art.reward
    def ties_on_even_seeds(t: art.Trajectory) -> float:  # a group on an even-seeded game has no signal
        return 0.0 if t.scenario["game"].seed % 2 == 0 else float(t.group_index)

    cfg = load_config(example.config, ["--steps", "2", "--base-model", "tiny", "--eval-games", "2",
                                       "--scenarios-per-step", "2", "--group-size", "2", "--warmup", "0",
                                       "--eval-every", "0"])
    cfg.update(dynamic_sampling=4)
    art.configure(backend_options={"device": "cpu", "home": str(tmp_path / "home")})
    result = await train(cfg, example.rollout, [ties_on_even_seeds], example.make_scenarios)
    held = streams.held_out(example.make_scenarios, cfg)
    for step, h in enumerate(result["history"]):
        pool = streams.training(example.make_scenarios, 8, 0, step, cfg, held)
        assert [g.seed for g in pool[:2]] == [g.seed for g in streams.training(example.make_scenarios, 2, 0, step,
                                                                                cfg, held)]  # its usual ones first
        odd = [i for i, g in enumerate(pool) if g.seed % 2]
        assert len(odd) >= 2, "the test needs two odd seeds among the first 8"
        drawn = odd[1] + 1  # drawn in rounds until two groups differ
        assert h["groups_trained"] == 2 and h["groups_skipped"] == 0, h
        assert (h["scenarios_drawn"], h["groups_dropped"]) == (drawn, drawn - 2)
        seeds = {g.seed for g in pool[:drawn]}
        stored = [t for t in art_store.trajectories(project=cfg["project"]) if t.scenario["game"]["seed"] in seeds]
        assert len(stored) == 2 * drawn  # the tied groups are stored too
    await client.close()


async def test_an_example_trains_pipelined_on_the_sequential_runs_scenarios(art_store, tmp_path, monkeypatch):
    """--max-policy-lag 1: the next step's rollouts gathered while a step trains (run.loop), on
    the very scenarios the sequential loop would draw for each step."""
    import importlib

    from openai import AsyncOpenAI

    from examples import streams
    from examples.runner import load_config, train

    agent_module = importlib.import_module("examples.reviews.agent")
    client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")
    monkeypatch.setattr(agent_module, "client", client)
    example = importlib.import_module("examples.reviews.train").EXAMPLE

    @art.reward(weight=1e-6)
    def first_token(t: art.Trajectory) -> float:
        return float(t.calls[0].choices[0].token_ids[0])

    cfg = load_config(example.config, ["--steps", "3", "--base-model", "tiny", "--eval-games", "2",
                                       "--scenarios-per-step", "2", "--group-size", "2", "--max-policy-lag", "1"])
    art.configure(backend_options={"device": "cpu", "home": str(tmp_path / "home")})
    result = await train(cfg, example.rollout, [*example.rewards, first_token], example.make_scenarios)
    assert [h["step"] for h in result["history"]] == [1, 2, 3]
    assert all(h["loop/max_policy_lag"] == 1.0 and h["policy_lag_max"] <= 1 for h in result["history"])
    trained_on = {t.scenario["review"]["text"] for t in art_store.trajectories(project=cfg["project"])
                  if t.step is not None and t.group_id is not None and len(t.calls)}
    held = streams.held_out(example.make_scenarios, cfg)
    drawn = {r.text for step in range(3) for r in streams.training(example.make_scenarios, 2, 0, step, cfg, held)}
    assert drawn <= trained_on
    await client.close()


def test_paired_gains_and_expected_values():
    from bench.stats import expected, fmt_gain, mean_se, paired

    m, se, n = mean_se([1.0, 0.0, None, 1.0, 0.0])
    assert (m, n) == (0.5, 4) and se == pytest.approx(0.2887, abs=1e-4)
    big = paired([0.0] * 30 + [1.0] * 2, [1.0] * 30 + [1.0] * 2)
    assert big["gain"] == pytest.approx(30 / 32) and not big["noise"] and big["low"] > 0.8
    small = paired([0.0, 1.0, 0.0, 1.0, 0.5, 0.5], [1.0, 0.0, 0.0, 1.0, 0.5, 1.0])
    assert small["noise"] and fmt_gain(small).endswith("(within noise)")
    assert "within noise" not in fmt_gain(big)
    with pytest.raises(ValueError, match="same scenarios"):
        paired([1.0], [1.0, 2.0])
    e = expected([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    assert e["each"] == [0.5, 0.5] and e["reward"] == 0.5 and e["draws"] == 4 and e["spread"] > 0


# -- the demo's runner: Ctrl-C ----------------------------------------------------------------

def _sigint_ignored_and_blocked() -> None:
    """In the child before it starts: SIGINT as a background job of a script, or a process a
    test runner's worker started, inherits it -- ignored and blocked."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


@pytest.mark.parametrize("started", ["from a shell", "with SIGINT ignored and blocked"])
def test_ctrl_c_stops_in_seconds_with_one_line_and_keeps_what_ran(tmp_path, started):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    p = subprocess.Popen(
        [sys.executable, "-m", "artsdk.cli", "train", str(root / "examples" / "reviews"), "--base-model", "tiny",
         "--steps", "50", "--group-size", "32", "--scenarios-per-step", "16", "--eval-games", "4"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        preexec_fn=_sigint_ignored_and_blocked if started != "from a shell" else None)
    done = 0
    for line in p.stdout:  # two steps done; the third one's 512 rollouts are under way
        done += bool(re.match(r"step \d+: reward", line))
        if done == 2:
            break
    time.sleep(0.3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:  # it ignored Ctrl-C: not left running its 50 steps
            p.kill()
            p.wait(30)
    assert p.returncode == 130 and time.monotonic() - t0 < 20
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted:"), err[-2000:]
    store = art.Store(str(tmp_path / ".artsdk" / "store.db"))
    interrupted = store.trajectories(project="reviews", error=True, limit=10_000)
    assert interrupted and all(t.error.type == "Interrupted" for t in interrupted)
    folder = tmp_path / ".artsdk" / "reviews" / "review-agent" / "checkpoints"
    on_disk = sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []
    assert [s["step"] for s in store.steps("reviews", "review-agent")] == on_disk  # whole steps, or none
    store.close()


# -- the runner: a new run each time, or --resume to finish the last one, on either backend ----

@pytest.mark.parametrize("backend", ["local", "remote"])
async def test_fresh_and_resumed_runs_alike_on_both_backends(backend, art_store, tmp_path, monkeypatch, capsys):
    import importlib

    from openai import AsyncOpenAI

    from examples.runner import load_config, train
    from tests.serve_process import KEY, Serve, free_port

    agent_module = importlib.import_module("examples.reviews.agent")
    monkeypatch.setattr(agent_module, "client", AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused"))
    mod = importlib.import_module("examples.reviews.train")

    @art.reward(weight=1e-6)
    def first_token(t: art.Trajectory) -> float:  # a difference within every group, so every step trains
        return float(next((c.choices[0].token_ids[0] for c in t.calls if c.choices and c.choices[0].token_ids), 0))

    serve = None
    if backend == "remote":
        serve = Serve(tmp_path, free_port()).start()
        art.configure(backend="remote", backend_url=serve.url, api_key=KEY)
    else:
        art.configure(backend_options={"device": "cpu", "home": str(tmp_path / "home")})
    args = ["--base-model", "tiny", "--eval-games", "2", "--scenarios-per-step", "2", "--group-size", "2"]
    try:
        runs = []
        for extra in (["--steps", "2"], ["--steps", "2"], ["--steps", "3", "--resume"]):
            capsys.readouterr()
            result = await train(load_config(mod.CONFIG, args + extra), agent_module.label, [*mod.REWARDS, first_token],
                                 mod.make_scenarios)
            runs.append((result, capsys.readouterr().out))
    finally:
        if serve is not None:
            serve.stop()
    (first, out1), (second, out2), (third, out3) = runs
    assert [h["step"] for h in first["history"]] == [1, 2] and "from the base model" in out1
    # run again: a new run from the base model (through artsdk serve it resumed at step 2, before)
    assert [h["step"] for h in second["history"]] == [1, 2] and second["run"] != first["run"]
    assert "resumed at" not in out2 and "moved to" in out2
    # --resume finishes the second run: one more step, numbered 3, the "before" it began with
    assert [h["step"] for h in third["history"]] == [3] and third["run"] == second["run"]
    assert "resumed at step 2" in out3 and "eval before (when the run began)" in out3
    assert third["before"] == second["before"]
    assert {r["run"]: r["last_step"] for r in art_store.runs(model="review-agent")} == {first["run"]: 2,
                                                                                        second["run"]: 3}
    assert art_store.count(run=first["run"]) == 2 + 2 * 4 + 2 and art_store.count(run=second["run"]) == 2 + 3 * 4 + 4


# -- bench.examples: baselines on the same scenarios and rewards, any model by URL -------------

async def test_example_baselines_and_a_model_by_url():
    from artsdk.testing.mock_server import MockServer
    from bench.examples import baselines, by_url, example_of
    from examples.runner import load_config

    ttt_example = example_of("tic_tac_toe")
    cfg = load_config(ttt_example.config, [])
    rows = await baselines(ttt_example, cfg, draws=40)
    scripted, rand = rows["win, block, centre (scripted)"], rows["random legal move"]
    assert scripted["scenarios"] == rand["scenarios"] == cfg["eval_games"]
    assert scripted["reward"] > rand["reward"] > 0 and scripted["solved"] >= rand["solved"]
    # the random player as an expected value: the mean of its draws, with one draw's spread
    assert rand["draws"] == 40 and 0 < rand["spread"] < 0.2 and len(rand["each"]) == cfg["eval_games"]
    one = await baselines(ttt_example, cfg, draws=1)
    assert one["random legal move"]["reward"] != rand["reward"]  # a single draw is not the expectation
    assert "draws" not in scripted and scripted["se"] > 0  # a scripted player once, with its standard error
    email_rows = await baselines(example_of("email_agent"), load_config(example_of("email_agent").config, []), draws=2)
    assert email_rows["always \"I don't know\""]["reward"] == 0.0
    assert email_rows["search, read the top hit, copy (scripted)"]["reward"] > 1.0

    def first_free(messages):  # a model that plays the first free cell it is shown
        return re.search(r"Free: (\w+)", messages[-1]["content"]).group(1)

    with MockServer(script=first_free) as server:
        row = await by_url(ttt_example, cfg, server.base_url, "some-model", "k")
        models = {r["body"]["model"] for r in server.app.state.requests}
        temperatures = {r["body"]["temperature"] for r in server.app.state.requests}
    assert row["failed"] == 0 and row["scenarios"] == cfg["eval_games"] and models == {"some-model"}
    assert temperatures == {0.0} and row["reward"] >= 0  # every move legal: no -0.5
    # a model playing the first free cell scores what the scripted first-free player scores
    assert row["reward"] == pytest.approx(rows["first free cell (scripted)"]["reward"])
    # a config that plays its held-out games at a temperature (eval_temperature): a model by URL is
    # asked at that temperature too, so its row compares with the trained model's
    g2048 = example_of("game_2048")
    g_cfg = {**load_config(g2048.config, []), "eval_temperature": 1.0}
    with MockServer(script=lambda messages: "up") as server:
        row = await by_url(g2048, g_cfg, server.base_url, "some-model", "k")
        temperatures = {r["body"]["temperature"] for r in server.app.state.requests}
    assert temperatures == {1.0} and row["scenarios"] == g_cfg["eval_games"] and row["failed"] == 0
