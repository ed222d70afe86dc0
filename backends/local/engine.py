"""The built-in inference engine: one thread that batches concurrent requests into shared
forward passes and samples tokens, recording each sampled token id and its logprob. (The
other engine, vllm_engine.py, drives vLLM in a process of its own; both answer ``submit``,
``publish``, ``retire``, ``training`` and ``close`` the same way.)

Requests that arrive while a batch is running wait for the next batch (dynamic batching).
Each request names the adapter step it runs on; the model that owns the engine pins that
step until the request is answered (see ``ServedModel.submit``), so a request in flight when
a new adapter is published finishes on the one it started with.

Recorded logprobs are those of the distribution sampled from: the logits divided by the
request's temperature (greedy requests: temperature 1), cut by ``min_tokens`` and top-p and
renormalised, as vLLM's ``processed_logprobs``. The trainer recomputes the tempered, uncut
distribution; with top_p < 1 the sampler weight min(p_old / p_sampler, is_cap) then corrects
for the cut (the sampled distribution is the behaviour policy).

The model is shared with the trainer; ``lock`` keeps a training step and a generation
batch from running on it at the same time. Publishing a step into a retired step's adapter
happens between two tokens of the batch being decoded (``between``): serving never stops for it.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from artsdk.futures import settle

from .prefix_cache import PrefixCache

log = logging.getLogger("artsdk.local")
QUIET, GATHER = 0.005, 0.03
# Temperatures below this sample as if they were this: dividing logits by 1e-300 overflows,
# and below 0.01 the distribution is one token anyway. (0 means greedy.)
MIN_TEMPERATURE = 0.01


class EngineRefused(ValueError):
    """The engine will not run this request as asked (the server answers 400 with why)."""


@dataclass
class Completion:
    """One sampled answer."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[str] = None


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: Optional[int] = None
    min_tokens: int = 0  # stop tokens are not sampled before this many tokens
    # streaming: called from the engine thread as (choice index, token id, logprob, new text)
    on_token: Optional[Callable[[int, int, float, str], None]] = None
    step: int = 0
    future: "Future[list[Completion]]" = field(default_factory=Future)
    emitted: bool = False  # some of its tokens were streamed out already
    cancelled: bool = False  # its client went away: stop at the next token (set from another thread)


@dataclass
class Seq:
    """One choice of a request being decoded."""

    req: Request
    index: int
    out: Completion = field(default_factory=Completion)
    done: bool = False
    generator: Optional[torch.Generator] = None
    sent: int = 0  # characters of out.text already streamed


class Engine:
    """The built-in engine (see the module docs). Shares ``model`` -- a peft model whose
    ``policy`` adapter is trained -- with the trainer."""

    def __init__(self, model: Any, tokenizer: Any, stop_ids: list[int], device: str, *,
                 max_batch: int = 64, merger: Any = None, prefix_cache: Optional[PrefixCache] = None) -> None:
        self.model = model
        self.prefix_cache = prefix_cache  # keys and values of earlier sequences, by tokens and step
        self.tok = tokenizer
        self.stop_ids = set(stop_ids)
        self.device = device
        self.max_batch = max_batch
        self.merger = merger  # merges the served adapter into the weights (see merge.py)
        self.lock = threading.RLock()
        self.wanting = threading.Event()  # a generation batch waits for ``lock`` (a training step may lend it)
        self.slots: dict[int, str] = {}  # step -> serving adapter
        self.free: list[str] = []  # serving adapters no step uses any more
        self._slots_lock = threading.Lock()
        self._jobs: list[tuple[Callable[[], None], "Future[None]"]] = []  # to run between two tokens
        self._jobs_lock = threading.Lock()
        self._queue: "queue.Queue[Optional[Request]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="artsdk-engine", daemon=True)
        self._thread.start()
        self.stats = {"batches": 0, "sequences": 0, "tokens": 0}

    def submit(self, req: Request) -> "Future[list[Completion]]":
        if not self._thread.is_alive():
            raise RuntimeError("the inference engine has stopped")
        self._queue.put(req)
        return req.future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(30)

    # -- adapters: each served step is a copy of the policy adapter --------------------------

    def publish(self, step: int, folder: Optional[Path] = None,
                weights: Optional[dict[str, torch.Tensor]] = None) -> None:
        """Serve ``step``: the policy adapter's current weights, or ``weights`` (an adapter's
        state in peft's keys: a replica loading a step's files). (``folder``, the step's
        checkpoint, is not needed: the weights are in memory.) Into a retired step's adapter
        this is done between two tokens of a batch being decoded, so no request waits for it;
        the first steps create adapters (a LoRA pair in every layer), with no batch running, and
        one spare for the next step."""
        with self._slots_lock:
            name = self.free.pop() if self.free else None
        if name is not None:
            self.between(lambda: self._fill(name, weights))
        else:
            with self.lock:
                name = self._new_slot()
                self._fill(name, weights)
                if not self.free:
                    spare = self._new_slot()
                    with self._slots_lock:
                        self.free.append(spare)
        with self._slots_lock:
            self.slots[step] = name

    def _new_slot(self) -> str:
        """A new serving adapter (hold ``lock``: this changes the model's modules)."""
        name = f"s{len(self.model.peft_config)}"
        while name in self.model.peft_config:
            name += "x"
        self.model.add_adapter(name, self.model.peft_config["policy"])
        return name

    def _fill(self, name: str, weights: Optional[dict[str, torch.Tensor]]) -> None:
        """Copy the policy adapter (or ``weights``) into serving adapter ``name``, which no request
        uses (hold ``lock``, or run between two tokens: ``between``)."""
        if self.merger is not None and self.merger.merged == name:
            # the weights merged in are this slot's old ones (a retired step's): unmerge, or the
            # new step would be answered by the old one's weights
            self.merger.restore()
        with torch.no_grad():
            if weights is not None:
                from peft import set_peft_model_state_dict

                set_peft_model_state_dict(self.model, weights, adapter_name=name)
                return
            params = dict(self.model.named_parameters())
            for key, p in params.items():
                if f".{name}." in key:
                    p.copy_(params[key.replace(f".{name}.", ".policy.")])

    def between(self, job: Callable[[], None]) -> None:
        """Run ``job`` while no forward pass runs: now if no batch is being decoded, else on the
        engine's thread between two of its tokens. Returns once it ran (its error raised)."""
        done: "Future[None]" = Future()
        entry = (job, done)
        with self._jobs_lock:
            self._jobs.append(entry)
        while not done.done():
            if not self.lock.acquire(timeout=0.005):
                continue
            try:
                with self._jobs_lock:
                    mine = entry in self._jobs
                    if mine:
                        self._jobs.remove(entry)
                if mine:
                    _run(job, done)
            finally:
                self.lock.release()
        done.result()

    def _run_jobs(self) -> None:
        """On the engine's thread, between two tokens: the jobs ``between`` was given."""
        if not self._jobs:
            return
        with self._jobs_lock:
            jobs, self._jobs = self._jobs, []
        for job, done in jobs:
            _run(job, done)

    def retire(self, step: int) -> None:
        """``step`` will not be asked for again: its adapter is free for reuse."""
        with self._slots_lock:
            if step in self.slots:
                self.free.append(self.slots.pop(step))
        if self.prefix_cache is not None:
            self.prefix_cache.retire(step)

    def adapter_for(self, step: int) -> Optional[str]:
        return None if step == 0 else self.slots[step]

    def lend(self) -> None:
        """From a training step holding ``lock``, between its rows: if a generation batch waits,
        let it run now; returns once the lock is back (the caller puts back what training
        needs: ``ServedModel._lend``). So rollouts go on while a step trains, a batch at a time."""
        if not self.wanting.is_set():
            return
        state = self.lock._release_save()  # type: ignore[attr-defined] - every level of the RLock
        try:
            deadline = time.monotonic() + 1.0
            while self.wanting.is_set() and time.monotonic() < deadline:
                time.sleep(0.0005)  # until the engine thread has the lock
        finally:
            self.lock._acquire_restore(state)  # type: ignore[attr-defined] - once its batch is done

    @contextmanager
    def training(self) -> Iterator[None]:
        """Generation waits while the weights change; the base weights are restored (the
        trainer and its KL reference need them). What only serving uses is let go for the
        step, so training's activations take its place instead of adding to it: the merged
        copy of the adapted layers (the next merge makes it anew) and the prefix cache (its
        keys were computed by the weights the step replaces; a batch lent to ``run.loop``
        during the step computes its prompts whole)."""
        with self.lock:
            if self.merger is not None:
                self.merger.release()
            if self.prefix_cache is not None:
                self.prefix_cache.clear()
            yield

    # -- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            # requests sent together reach us a few ms apart: wait until the queue has been
            # quiet for QUIET s (at most GATHER s) so they share the batch
            deadline = time.monotonic() + GATHER
            while sum(r.n for r in batch) < self.max_batch:
                wait = min(QUIET, deadline - time.monotonic())
                if wait <= 0:
                    break
                try:
                    nxt = self._queue.get(timeout=wait)
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            by_step: dict[int, list[Request]] = {}
            for r in batch:
                by_step.setdefault(r.step, []).append(r)
            for step, reqs in sorted(by_step.items()):
                self._generate_isolated(reqs, step)

    def _generate_isolated(self, reqs: list[Request], step: int) -> None:
        """Generate a batch; if it fails, run each of its requests alone, so a request that
        breaks generation fails by itself and the rest of its batch is answered. (A request
        that has already streamed tokens cannot start over: it gets the error.)"""
        try:
            self._generate(reqs, step)
            return
        except Exception as e:  # noqa: BLE001 - reported to the request(s) that caused it
            if len(reqs) == 1:
                log.exception("generation failed")
                settle(reqs[0].future, error=e)
                return
            failure = e
        for r in reqs:
            if r.future.done():
                continue
            if r.emitted:
                settle(r.future, error=failure)
                continue
            try:
                self._generate([r], step)
            except Exception as e:  # noqa: BLE001
                log.exception("generation failed for one request")
                settle(r.future, error=e)

    @torch.no_grad()
    def _generate(self, reqs: list[Request], step: int) -> None:
        for r in [r for r in reqs if r.cancelled]:  # gone before its turn came
            settle(r.future, [Completion(finish_reason="cancelled") for _ in range(r.n)])
        reqs = [r for r in reqs if not r.cancelled]
        if not reqs:
            return
        seqs = []
        for r in reqs:
            for i in range(r.n):
                g = None
                if r.seed is not None:
                    g = torch.Generator(device="cpu").manual_seed((r.seed + i) % 2**63)
                seqs.append(Seq(r, i, generator=g))
        self.wanting.set()
        with self.lock:
            self.wanting.clear()
            self._decode(seqs, step)
        for r in reqs:
            settle(r.future, [s.out for s in seqs if s.req is r])
        self.stats["batches"] += 1
        self.stats["sequences"] += len(seqs)

    def serving(self, step: int) -> Any:
        """A context in which ``model(...)`` is the model served for ``step`` (hold ``lock``)."""
        model = self.model
        adapter = self.adapter_for(step)
        if self.merger is not None:  # the adapter merged in: a plain forward pass
            if adapter is None:
                self.merger.restore()
            else:
                self.merger.merge(adapter)
            return model.disable_adapter()
        if adapter is None:
            return model.disable_adapter() if hasattr(model, "disable_adapter") else _null()
        model.set_adapter(adapter)
        return _null()

    def _prefill_inputs(self, prompts: list[tuple[int, ...]], step: int) -> dict[str, Any]:
        """The first forward pass's inputs for these distinct prompts: each prompt's tokens after
        what the prefix cache holds of it, left-padded so that every row ends at the same column,
        behind the cached keys and values (themselves left-padded the same way)."""
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        hits = [self.prefix_cache.lookup(step, p) if self.prefix_cache is not None else (0, None) for p in prompts]
        cached = max(n for n, _ in hits)
        width = max(len(p) - n for p, (n, _) in zip(prompts, hits))
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), cached + width), dtype=torch.long)
        pos = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, (p, (n, _)) in enumerate(zip(prompts, hits)):
            rest = p[n:]
            ids[row, width - len(rest):] = torch.tensor(rest)
            mask[row, cached - n:cached] = 1
            mask[row, cached + width - len(rest):] = 1
            pos[row, width - len(rest):] = torch.arange(n, len(p))
        inputs = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device),
                  "position_ids": pos.to(self.device)}
        if cached:
            from transformers import DynamicCache

            layers = []
            for layer in range(len(next(kv for _, kv in hits if kv is not None))):
                shape = next(kv[layer][0].shape for _, kv in hits if kv is not None)
                like = next(kv[layer][0] for _, kv in hits if kv is not None)
                keys = like.new_zeros((len(prompts), shape[0], cached, shape[2]))
                values = torch.zeros_like(keys)
                for row, (n, kv) in enumerate(hits):
                    if n:
                        keys[row, :, cached - n:] = kv[layer][0]
                        values[row, :, cached - n:] = kv[layer][1]
                layers.append((keys, values))
            inputs["past_key_values"] = DynamicCache(ddp_cache_data=layers, config=self.model.config)
        return inputs

    def _keep(self, s: Seq, past: Any, row: int, mask: torch.Tensor, step: int) -> None:
        """Put a finished choice's keys and values in the prefix cache: its prompt and the tokens it
        sampled, but the last (whose keys were never computed)."""
        if self.prefix_cache is None or s.out.finish_reason == "cancelled":
            return
        tokens = tuple(s.req.prompt) + tuple(s.out.token_ids[:-1])
        valid = mask[row].nonzero()[:, 0]
        if len(valid) != len(tokens):
            return  # not what it should be: better not kept than wrong
        kv = [(layer.keys[row][:, valid].clone(), layer.values[row][:, valid].clone()) for layer in past.layers]
        self.prefix_cache.store(step, tokens, kv)

    def _decode(self, seqs: list[Seq], step: int) -> None:
        model = self.model
        ctx = self.serving(step)
        # each distinct prompt is run once (a GRPO group, or n > 1, repeats one prompt); its
        # cache is then copied out to every sequence that shares it
        prompts: dict[tuple[int, ...], int] = {}
        share = [prompts.setdefault(tuple(s.req.prompt), len(prompts)) for s in seqs]
        inputs = self._prefill_inputs(list(prompts), step)
        mask, pos = inputs["attention_mask"], inputs["position_ids"]
        temps = torch.tensor([s.req.temperature for s in seqs], dtype=torch.float32, device=self.device)
        top_ps = torch.tensor([s.req.top_p for s in seqs], dtype=torch.float32, device=self.device)
        budget = max(s.req.max_tokens for s in seqs)
        alive = list(range(len(seqs)))  # rows of the running batch -> index into seqs
        with ctx:
            # only the last position's logits are sampled from: projecting every prompt position
            # onto the vocabulary would cost more than the rest of the prefill on a small model
            out = model(**inputs, use_cache=True, logits_to_keep=1)
            past = out.past_key_values
            if len(prompts) < len(seqs):
                index = torch.tensor(share, device=self.device)
                past.batch_select_indices(index)
                mask, pos, out.logits = mask[index], pos[index], out.logits[index]
            for _ in range(budget):
                logits = out.logits[:, -1, :].float()
                tokens, logprobs = self._sample(logits, temps, top_ps, [seqs[i] for i in alive])
                finished_rows = []
                for row, i in enumerate(alive):
                    s = seqs[i]
                    if append(s, int(tokens[row]), float(logprobs[row]), self.tok, self.stop_ids):
                        finished_rows.append(row)
                self.stats["tokens"] += len(alive)
                if finished_rows:
                    for row in finished_rows:
                        self._keep(seqs[alive[row]], past, row, mask, step)
                    done = set(finished_rows)
                    keep = [r for r in range(len(alive)) if r not in done]
                    if not keep:
                        return
                    alive = [alive[r] for r in keep]
                    index = torch.tensor(keep, device=self.device)
                    tokens, mask, pos = tokens[index], mask[index], pos[index]
                    temps, top_ps = temps[index], top_ps[index]
                    past.batch_select_indices(index)
                self._run_jobs()  # (an adapter being published into a free slot)
                mask = torch.cat([mask, torch.ones((len(alive), 1), dtype=mask.dtype, device=self.device)], 1)
                pos = pos[:, -1:] + 1
                out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=pos,
                            past_key_values=past, use_cache=True)
        for i in alive:  # ran out of budget
            if not seqs[i].done:
                seqs[i].out.finish_reason = "length"
                seqs[i].done = True

    def _sample(self, logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor,
                seqs: list[Seq]) -> tuple[torch.Tensor, torch.Tensor]:
        greedy = temps <= 0
        scaled = logits / torch.where(greedy, torch.ones_like(temps), temps.clamp(min=MIN_TEMPERATURE))[:, None]
        young = [r for r, s in enumerate(seqs) if len(s.out.token_ids) < s.req.min_tokens]
        if young and self.stop_ids:
            scaled = scaled.clone()
            scaled[torch.tensor(young)[:, None], torch.tensor(sorted(self.stop_ids))[None, :]] = -math.inf
        # the logprob recorded is that of the distribution sampled from: tempered (greedy rows:
        # temperature 1), then cut by min_tokens and top_p and renormalised -- what vLLM's
        # processed_logprobs give too, so the sampler weight means the same on both engines
        logprobs_all = torch.log_softmax(scaled, dim=-1)
        probs = logprobs_all.exp()
        if bool((top_ps < 1.0).any()):
            sorted_p, order = probs.sort(dim=-1, descending=True)
            over = (sorted_p.cumsum(-1) - sorted_p) > top_ps[:, None]
            sorted_p = sorted_p.masked_fill(over, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
            kept = probs.sum(-1, keepdim=True)
            probs = probs / kept
            logprobs_all = logprobs_all - kept.log()
        if any(s.generator is not None for s in seqs):
            picked = torch.stack([
                torch.multinomial(probs[r].cpu(), 1, generator=s.generator)[0] for r, s in enumerate(seqs)
            ]).to(logits.device)
        else:
            picked = torch.multinomial(probs, 1)[:, 0]
        tokens = torch.where(greedy, scaled.argmax(-1), picked)
        return tokens, logprobs_all.gather(-1, tokens[:, None])[:, 0]

def append(s: Seq, token: int, logprob: float, tok: Any, stop_ids: set[int]) -> bool:
    """Add a sampled token to a choice (and stream what text it completes); True when the
    choice is finished. Both engines decode through this, so text, stop strings and
    streaming behave the same whichever sampled the tokens."""
    out, req = s.out, s.req
    if req.cancelled:  # nobody is waiting for the rest
        out.finish_reason = "cancelled"
        s.done = True
        return True
    out.token_ids.append(token)
    out.logprobs.append(logprob)
    reason = None
    if token in stop_ids:
        reason = "stop"  # the stop token is trained on (it was sampled), never shown
    else:
        text = tok.decode([t for t in out.token_ids if t not in stop_ids], skip_special_tokens=False)
        for stop in req.stop:
            cut = text.find(stop) if stop else -1
            if cut != -1:
                text, reason = text[:cut], "stop"
                break
        out.text = text
        if reason is None and len(out.token_ids) >= req.max_tokens:
            reason = "length"
    if req.on_token is not None:
        # hold back what could still become a stop string or an unfinished character
        upto = len(out.text)
        if reason is None:
            upto -= max((len(x) for x in req.stop), default=1) - 1
            while upto > s.sent and out.text[upto - 1] == "\ufffd":
                upto -= 1
        upto = max(upto, s.sent)
        try:
            req.on_token(s.index, token, logprob, out.text[s.sent:upto])
            req.emitted = True
        except Exception:  # noqa: BLE001 - its listener is gone (a closed stream): decode on, quietly
            req.on_token = None
        s.sent = upto
    if reason is not None:
        out.finish_reason = reason
        s.done = True
        return True
    return False


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _run(job: Callable[[], None], done: "Future[None]") -> None:
    try:
        job()
    except BaseException as e:  # noqa: BLE001 - handed to the caller of ``between``
        done.set_exception(e)
    else:
        done.set_result(None)
