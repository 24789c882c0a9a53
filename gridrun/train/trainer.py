"""One cell's run: `gridrun run <run_dir>` reads config.yaml and writes only inside run_dir.

The loop reads top to bottom: rollout -> reward -> advantages -> update -> log ->
validate -> checkpoint, each a call into a module that is tested alone. A `base` cell only
validates at step 0. When training ends (done, or stopped by train.on_alert), the peak
chosen on val is measured once on the task's test split (`test_at_peak`): the row
`split: test` at the peak's step, so Table 1's peak has a number its choice did not inflate. Checkpoints: every `save_every` steps and at each new validation peak;
the newest `keep_checkpoints` and the peak's survive (gridrun/train/checkpoint.py). Resuming takes the newest complete checkpoint and replays from there,
so an interrupted run ends with the same adapters and metric rows as an uninterrupted one
(on CPU; `time/` keys aside).

Several ranks (a SLURM job's tasks; gridrun/train/distributed.py) share each step's problems
and sum their gradients; rank 0 alone writes the run dir. SIGUSR2 (the scheduler's warning
before preemption or the time limit) stops every rank after the current step, with a
checkpoint, and records `preempted`.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict
from typing import Any

import torch

from gridrun.export import ExportError, export
from gridrun.seam import cellstate
from gridrun.seam.accuracy import first_peak, val_accuracy
from gridrun.seam.mechanisms import CANDIDATES, MECHANISMS, RESPONSE_CAP, MechanismWatch, alert_flags
from gridrun.seam.metric_keys import VAL_ROLE, role_key
from gridrun.seam.records import ValidationRecord
from gridrun.seam.routing import adapter_lr_scales, grouping
from gridrun.seam.runconfig import RunConfig
from gridrun.seam.rundir import RANK_STEPS_KEPT, RunDir, atomic_write_text
from gridrun.seam.significance import COLLAPSE, Evaluations, FallRule, first_cliff
from gridrun.tasks import make_task
from gridrun.tasks.base import Problem
from gridrun.train import checkpoint, lr_schedule
from gridrun.train.advantages import estimator, shuffle_rewards, turn_advantages
from gridrun.train.coherence import Coherence
from gridrun.train.credit import assign_credit, role_reward_metrics
from gridrun.train.distributed import (
    Dist,
    device_report,
    free_gpu_gb,
    reserved_gb,
    reset_peak_reserved,
    return_cached_memory,
)
from gridrun.train.engines import make_engine
from gridrun.train.episode import Episode
from gridrun.train.metrics_log import MetricsLog
from gridrun.train.model import load_base
from gridrun.train.policy import adapter_parameters, attach_adapters, routing_for
from gridrun.train.rollout import AdapterNotServed, ChatEncoder, SamplingParams, StageBatcher, StageCost
from gridrun.train.sampler import ProblemSampler
from gridrun.train.scoring import BackgroundScorer
from gridrun.train.seeds import Stream, derive
from gridrun.train.update import TrainSeq, UpdateSettings, update
from gridrun.train.validate import validation_metrics

log = logging.getLogger("gridrun")
class Preempted(Exception):
    """Raised at a step boundary after SIGUSR2, once the step is checkpointed."""


class Trainer:
    def __init__(self, config: RunConfig, run_dir: RunDir, model_files: str, dist: Dist | None = None) -> None:
        """`model_files`: the base model's directory (or hub id), resolved from config.model by
        the run entry (gridrun/cellrun.py builds the toy world there)."""
        self.config, self.run_dir = config, run_dir
        self.dist = dist or Dist()
        seed = config.cell.seed
        random.seed(derive(seed, Stream.CELL))
        torch.manual_seed(derive(seed, Stream.CELL))
        self.task = make_task(config.task)
        self.workflow = config.workflow_entry()
        estimator(config.grpo.estimator)  # an unknown grpo.estimator fails here, before the model loads
        # Adapters trained elsewhere (transfer, eval) are found first: a missing one fails fast.
        self.routing = routing_for(config, self.workflow, run_dir.root)
        # On a GPU node each rank trains on its own device; CPU runs stay where they are.
        base, self.tokenizer = load_base(config.model, model_files, self.dist.device)
        self.model = attach_adapters(base, config, self.routing)
        # Checkpointing acts in the update only: a cell that does not train (base, eval,
        # transfer) has none, and a base cell's model has no adapters to unwrap.
        if config.train.gradient_checkpointing and config.trains:
            self.model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # The update runs in training mode (checkpointing acts only there; LoRA and Qwen3 have
        # no dropout here, so the numbers are the same); engines switch to eval to generate.
        self.model.train()
        opt = config.optim
        self.optimizers: dict[str, torch.optim.Optimizer] = {
            name: torch.optim.AdamW(
                list(adapter_parameters(self.model, name).values()),
                lr=opt.lr,
                betas=(opt.beta1, opt.beta2),
                eps=opt.eps,
                weight_decay=opt.weight_decay,
            )
            for name in self.routing.trainable
        }
        # The engine's start hands it the GPU too: vLLM takes its share of what is free then.
        return_cached_memory(self.dist.device)
        self.engine = make_engine(config, self.model, self.tokenizer, self.routing.trainable)
        # Where this rank runs (its engine inherits the same CUDA_VISIBLE_DEVICES): its record.
        self.rank_record: dict[str, Any] = {**device_report(self.dist), "engine": config.engine.name, "steps": []}
        self.last_stages: list[StageCost] = []
        self.encoder = ChatEncoder.for_model(self.tokenizer, config.model, config.lengths.max_prompt_tokens)
        self.sampler = ProblemSampler(self.task.train_problems(), seed)
        self.update_rng = random.Random(derive(seed, Stream.UPDATE))
        # I6 (grpo.coherence > 0): the per-role gradient EMAs, kept in every checkpoint.
        self.coherence = Coherence(config.grpo.coherence, config.grpo.coherence_decay) if config.grpo.coherence else None
        # Optimizer steps skipped for a non-finite loss or gradient, over the whole run.
        self.skipped_nonfinite = 0
        # Every alert (gridrun/seam/mechanisms.py) and the validation accuracies of the metric rows
        # so far (a resume replays the rows it keeps into both).
        self.watch = MechanismWatch(config.workflow.name, config.policy.name, groups=grouping(config),
                                    signals=config.train.alert_signals)
        self.mechanism_alerts: list[str] = []
        # Whether train.on_alert has acted (once per cell; a resume reads it from state.json).
        self.alert_acted = run_dir.read_state().alert_step is not None if self.dist.is_main else False
        self.val_acc: dict[int, float] = {}
        # The collapse detector's inputs (train.fall_alert): each validation's SE and record.
        self.val_se: dict[int, float] = {}
        self.val_records: dict[int, ValidationRecord] = {}
        self.fall_alert: str | None = None
        if self.dist.is_main and not self.task.test_problems():
            log.warning("%s", self.task.test_missing)
        self.pad_id = self.tokenizer.pad_token_id
        self.total_steps = config.steps_to_train
        self.dist.decorrelate_rng(seed, 0)

    # --- the loop -------------------------------------------------------------------------
    def fit(self) -> cellstate.Transition | None:
        """Train to the end (None), or until train.on_alert=stop ends the cell: the
        `stopped` transition to record instead of `done`."""
        start = self.resume()
        main = self.dist.is_main
        self.metrics = MetricsLog(self.run_dir, self.config, enabled=main)
        try:
            # The adapters as they start (initial, or the checkpoint's), proven served before any rollout.
            self.refresh_engine(start)
            if start == 0:
                self.validate(0)
                if main:
                    self.run_dir.record(cellstate.progressed(step=0))
            for step in range(start + 1, self.total_steps + 1):
                self.log_row(self.train_step(step))
                peaked = False
                if step % self.config.train.val_every == 0 or step == self.total_steps:
                    self.validate(step)
                    peaked = self.peak_step() == step
                    self.detect_fall()
                # A new peak is checkpointed whatever save_every says: it is the model
                # behind the cell's Table 1 number, kept until a higher peak replaces it.
                saved = step % self.config.train.save_every == 0 or step == self.total_steps or peaked
                if saved:
                    self.save(step)
                if main:
                    self.run_dir.record(cellstate.progressed(step=step, alerts=self.alerts()))
                stop = self.act_on_alerts(step)
                if stop is not None:
                    if not saved:
                        self.save(step)
                    self.test_at_peak()
                    return stop
                if step < self.total_steps and self.dist.should_stop():
                    if not saved:
                        self.save(step)
                    raise Preempted(f"stopped after step {step} on SIGUSR2, checkpointed")
            self.test_at_peak()
            return None
        finally:
            self.metrics.close()
            self.engine.close()

    def rollout(self, problems: list[Problem], samples: int, temperature: float) -> list[Episode]:
        episodes = [Episode(problem=p, sample=k) for p in problems for k in range(samples)]
        sampling = SamplingParams(temperature, self.config.lengths.max_response_tokens, self.config.sampling.top_p)
        batcher = StageBatcher(self.engine, self.encoder, self.routing.adapter, sampling)
        spec = self.config.workflow

        scorer = BackgroundScorer(self.task)

        async def program(llm: Any, episode: Episode) -> None:
            await self.workflow.run(llm, episode, self.task, spec, self.config.protocol)
            scorer.submit(episode)

        try:
            batcher.run(episodes, program)
        finally:
            scorer.finish()
        self.last_stages = batcher.stages
        return episodes

    def train_step(self, step: int) -> dict[str, Any]:
        cfg = self.config
        started = time.time()
        self.dist.gather_s = 0.0
        problems = self.dist.shard(self.sampler.take(cfg.train.batch_problems))
        episodes = self.rollout(problems, cfg.grpo.n, cfg.sampling.temperature)
        rolled = time.time()
        if cfg.shuffles_rewards:
            shuffle_rewards(episodes, cfg.cell.seed, step, self.dist)
        if cfg.reward.credit == "per_role":
            assign_credit(episodes, self.task, self.workflow)
        # Every rank's outcomes, in single-process order (groups are whole on one rank).
        outcomes, _ = self.dist.gather([(e.reward, e.scored.correct, e.scored.parsed is None,
                                         e.scored.flag == "timeout") for e in episodes])
        rewards = torch.tensor([o[0] for o in outcomes])
        advantages, groups = turn_advantages(episodes, self.workflow, cfg.grpo, self.dist)
        trainable = set(self.routing.trainable)
        seqs = [
            TrainSeq(
                role=turn.role,
                adapter=adapter,
                prompt_ids=turn.prompt_ids,
                completion_ids=turn.completion_ids,
                rollout_logp=turn.logprobs,
                advantage=adv,
                truncated=turn.finish_reason == "length",
            )
            for episode, episode_advantages in zip(episodes, advantages)
            for turn, adv in zip(episode.turns, episode_advantages)
            if (adapter := self.routing.adapter(turn.role)) in trainable
        ]
        lrs = self.adapter_lrs(step)
        # The row's `lr` is the first adapter's schedule LR (each adapter's own, role scale
        # included, is adapter/<a>/lr): under per_update stepping an IP step's adapters differ.
        lr = self.lr(step, 0, len(self.routing.trainable))
        device = self.dist.device
        memory = {"free_gpu_gb_awake": free_gpu_gb(device)}
        self.engine.sleep()
        memory["free_gpu_gb_asleep"] = free_gpu_gb(device)
        reset_peak_reserved(device)
        update_metrics = update(
            self.model, self.routing, self.optimizers, seqs, UpdateSettings.of(cfg, self.pad_id), lrs, self.update_rng,
            self.dist, self.coherence,
        )
        self.record_skipped(int(update_metrics["train/skipped_nonfinite"]))
        self.engine.check_agreement(update_metrics)
        memory.update(self.hand_gpu_to_engine())
        proof = self.refresh_engine(step)
        done = time.time()
        row: dict[str, Any] = {
            "step": step,
            "split": "train",
            "lr": lr,
            "reward/mean": float(rewards.mean()),
            "reward/acc": sum(o[1] for o in outcomes) / len(outcomes),
            "reward/no_answer_rate": sum(o[2] for o in outcomes) / len(outcomes),
            # Answers the grader gave up on (past its time limit), scored wrong: a count.
            "reward/grader_timeouts": sum(o[3] for o in outcomes),
            **role_reward_metrics(episodes, self.dist),
            "adv/groups": groups.groups,
            "adv/singleton_groups": groups.singleton,
            "adv/zero_variance_groups": groups.zero_variance,
            **{role_key(role, "zero_var_share"): share for role, share in groups.role_zero_variance.items()},
            "time/rollout_s": rolled - started,
            "time/update_s": done - rolled,
            "time/step_s": done - started,
            **update_metrics,
            **proof,
        }
        row.update(self.record_costs(step, seqs, rolled - started, done - rolled, memory))
        log.info("step %d/%d reward %.3f acc %.3f (%.1fs)", step, self.total_steps, row["reward/mean"], row["reward/acc"], row["time/step_s"])
        return row

    def hand_gpu_to_engine(self) -> dict[str, float | None]:
        """After the update: the trainer returns its cached GPU memory, then wakes the engine.
        The allocator would otherwise keep the update's reserved peak while vLLM maps its whole
        share again (gridrun/memory.py: no card holds both). The GPU memory at each hand-over
        (GiB, None on the CPU): free after the update, the trainer's reserved peak, free once
        returned, what the trainer keeps, free with the engine awake."""
        device = self.dist.device
        memory = {"free_gpu_gb_updated": free_gpu_gb(device), "trainer_peak_gb": reserved_gb(device, peak=True)}
        return_cached_memory(device)
        memory.update(free_gpu_gb_released=free_gpu_gb(device), trainer_kept_gb=reserved_gb(device))
        self.engine.wake()
        memory["free_gpu_gb_woken"] = free_gpu_gb(device)
        if device.type == "cuda":
            log.info("GPU memory (GiB): trainer's update peak %.1f, %.1f kept beside the engine; free %.1f after the "
                     "update, %.1f once returned, %.1f with the engine awake", memory["trainer_peak_gb"],
                     memory["trainer_kept_gb"], memory["free_gpu_gb_updated"], memory["free_gpu_gb_released"],
                     memory["free_gpu_gb_woken"])
        return memory

    def record_costs(self, step: int, seqs: list[TrainSeq], rollout_s: float, update_s: float,
                     memory: dict[str, float | None]) -> dict[str, float]:
        """This rank's costs of the step into its own record (ranks/rank<r>.json: `gridrun
        canary` reads it) and the metric row's `time/` keys (rank-local, so a comparison of
        runs leaves them out): per rollout stage seconds and generated tokens (a continuous
        rollout: one entry, the whole rollout), the update's tokens, the time spent gathering
        across ranks, and the GPU memory at each hand-over (`memory`, RANK_FIELDS)."""
        stages = [asdict(cost) for cost in self.last_stages]
        update_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in seqs)
        entry = {"step": step, "stages": stages, "rollout_s": rollout_s, "update_s": update_s,
                 "update_tokens": update_tokens, "gather_s": self.dist.gather_s, **memory}
        self.rank_record["steps"] = [*self.rank_record["steps"], entry][-RANK_STEPS_KEPT:]
        self.run_dir.write_rank_record(self.dist.rank, self.rank_record)
        row = {"time/gather_s": self.dist.gather_s, "time/update_tokens": float(update_tokens)}
        for k, cost in enumerate(self.last_stages):
            row[f"time/stage{k}_s"], row[f"time/stage{k}_tokens"] = cost.seconds, float(cost.tokens)
        return row

    def refresh_engine(self, step: int) -> dict[str, float]:
        """The engine serves the adapters as they are now, proven on every rank (its metrics,
        this rank's); any rank's failed proof stops every rank with its one line."""
        failure, proof = None, {}
        try:
            proof = self.engine.refresh_proven(step, self.routing.role_adapter)
        except AdapterNotServed as err:
            failure = str(err)
        failures = [f"rank {rank}: {line}" if self.dist.world > 1 else line
                    for rank, line in enumerate(self.dist.gather([failure])[0]) if line]
        if failures:
            raise AdapterNotServed(" | ".join(failures))
        return proof

    def adapter_lrs(self, step: int) -> dict[str, float]:
        """Each trainable adapter's LR this step: the schedule's, times its role's
        optim.role_lr_scale at this step (the config leaves a scaled role alone on its
        adapter; SP refuses the scale)."""
        reached = lr_schedule.ramp_reached(step, self.config.optim.role_lr_ramp)
        scales = adapter_lr_scales(self.config, reached)
        trainable = self.routing.trainable
        return {name: self.lr(step, i, len(trainable)) * scales.get(name, 1.0) for i, name in enumerate(trainable)}

    def lr(self, step: int, update_index: int, updates_per_step: int) -> float:
        opt = self.config.optim
        advances = lr_schedule.schedule_advances(step, update_index, updates_per_step, opt.lr_advance)
        return lr_schedule.lr_at(advances, opt.lr, opt.warmup_steps, self.total_steps, opt.schedule, opt.min_lr_ratio)

    def record_skipped(self, skipped: int) -> None:
        """Count non-finite updates into state.json at once (the alert follows with the row)."""
        if not skipped:
            return
        self.skipped_nonfinite += skipped
        if self.dist.is_main:
            self.run_dir.record(cellstate.progressed(skipped_nonfinite=self.skipped_nonfinite))

    def act_on_alerts(self, step: int) -> cellstate.Transition | None:
        """train.on_alert's action, once, when an alert that acts first holds after `step`: a
        mechanism alert, a candidate signal run live (train.alert_signals) or the collapse
        detector's (train.fall_alert):
        export_peak exports the peak validation's adapters and trains on; stop exports them
        and returns the transition that ends the cell. Every rank decides alike (rank 0's
        alerts, summed across ranks), so all of them leave the loop at the same step."""
        action = self.config.train.on_alert
        if action == "warn" or self.alert_acted:
            return None
        # The mechanisms, any candidate signal listed live (train.alert_signals) and the detector's.
        fired = ([a for a in self.alerts() if a.split(":", 1)[0] in (*MECHANISMS, *CANDIDATES, COLLAPSE)]
                 if self.dist.is_main else [])
        firing = bool(fired) if self.dist.world == 1 else self.dist.all_reduce_sum([float(bool(fired))])[0] > 0
        if not firing:
            return None
        self.alert_acted = True
        if not self.dist.is_main:
            return cellstate.stopped("", step, None) if action == "stop" and step < self.total_steps else None
        try:
            exported: str | None = self.export_peak()
            log.warning("step %d: %s; train.on_alert=%s: peak exported to %s", step, fired[0], action, exported)
        except (ExportError, OSError) as err:
            # The action's side job failed, not the run: the peak's checkpoint stays (kept by merit).
            exported = None
            log.warning("step %d: %s; train.on_alert=%s: the peak's export failed (%s); %s", step, fired[0], action,
                        err, "the cell stops" if action == "stop" else "training goes on")
        if action == "stop" and step < self.total_steps:
            return cellstate.stopped(fired[0], step, exported)
        # export_peak, or a stop at the last step: nothing is left to save, the cell ends done.
        self.run_dir.record(cellstate.alert_acted(action, fired[0], step, exported))
        return None

    def export_peak(self) -> str:
        """The peak validation's adapters exported (gridrun export's folder for its step), or
        "base model" when the peak is step 0 (no update beat it: nothing trained to keep)."""
        peak = self.peak_step()
        if not peak:
            return "base model"
        out = self.run_dir.export(peak)
        # A resumed run may have exported it before it stopped: that folder is the same checkpoint's.
        # Absolute: state.json is read from anywhere, whatever folder `gridrun run` was typed in.
        return str((out if out.exists() else export(self.run_dir, peak)).absolute())

    def alerts(self) -> list[str]:
        """state.json's alerts: what the metric rows so far say (gridrun/seam/mechanisms.py),
        and the collapse detector's, once it found a fall."""
        return self.mechanism_alerts + ([self.fall_alert] if self.fall_alert else [])

    def detect_fall(self) -> None:
        """train.fall_alert: the `collapse` alert once the validations so far hold a cliff
        (gridrun/seam/significance.py: a fall of 10+ points clearing the Bonferroni bound
        over the pairs of the run's planned validations, paired by problem). It needs no
        prediction: it is the yardstick itself, applied as the validations arrive, so a
        stopped run is judged exactly as its full run would have been up to that step."""
        if not self.config.train.fall_alert or not self.dist.is_main or self.fall_alert:
            return
        evals = Evaluations.of(self.val_acc, self.val_se, self.val_records)
        found = first_cliff(evals, FallRule(max(self.config.planned_validations, len(self.val_acc))))
        if found is not None:
            fall = found[1]
            self.fall_alert = (f"{COLLAPSE}: validation fell {fall.drop_pp:.1f} points from step {fall.peak_step} "
                               f"to step {fall.step} ({fall.test()})")

    def validate(self, step: int) -> None:
        cfg = self.config
        problems = self.task.val_problems() if cfg.train.val_split == "val" else self.task.train_problems()
        if cfg.train.val_problems is not None:
            problems = problems[: cfg.train.val_problems]
        started = time.time()
        # Validation draws from its own seed and leaves the training RNG untouched: the same
        # weights give the same validation whatever ran before (a `base` cell and a training
        # cell's step 0 agree exactly), and validating does not perturb training.
        with torch.random.fork_rng(devices=[self.dist.device] if self.dist.device.type == "cuda" else []):
            torch.manual_seed(derive(cfg.cell.seed, Stream.VALIDATION))
            episodes = self.rollout(self.dist.shard(problems), cfg.train.val_n, cfg.sampling.val_temperature)
        episodes, _ = self.dist.gather(episodes)
        if not self.dist.is_main:
            return
        metrics = validation_metrics(episodes, self.task, self.workflow, cfg.workflow)
        row = {"step": step, "split": "val", **metrics, RESPONSE_CAP: cfg.lengths.max_response_tokens,
               "time/val_s": time.time() - started}
        self.log_row(row)
        self.summarise(step, metrics)
        dumped = "".join(json.dumps(e.to_json()) + "\n" for e in episodes[: cfg.train.val_samples])
        self.run_dir.check_present()
        atomic_write_text(self.run_dir.samples(step), dumped)
        # Which problems it got right: what makes two validations a paired comparison.
        record = outcome_record("val", step, episodes)
        self.run_dir.write_record(record)
        self.val_records[step] = record
        if "val/acc_se" in metrics:
            self.val_se[step] = metrics["val/acc_se"]
        log.info("step %d validation: acc %.3f on %d problems", step, metrics["val/acc"], len(problems))

    # --- the test evaluation --------------------------------------------------------------
    def test_at_peak(self) -> None:
        """The peak (chosen on val, as Table 1's) measured once on the task's test split, with
        the validation's sampling settings and its own seed stream: records/test_step_<peak>.json
        and the metrics row `split: test` at the peak's step (in that order, so a row means its
        record is there). Every rank evaluates its shard; rank 0, which holds the validations,
        decides the step and whether a resumed run already wrote the row (then nothing runs)."""
        cfg = self.config
        problems = self.task.test_problems()
        if not problems:
            return  # said when the run started (task.test_missing)
        if cfg.train.val_problems is not None:
            problems = problems[: cfg.train.val_problems]
        main = self.dist.is_main
        peak = self.peak_step() if main else None
        skip = main and (peak is None or self.tested(peak) or not self.restorable(peak))
        # Non-main ranks add zeros: the sums are rank 0's values.
        shared_peak, shared_skip = self.dist.all_reduce_sum([float(peak or 0) if main else 0.0, float(skip)])
        if shared_skip:
            return
        peak = int(shared_peak)
        if self.routing.trainable:
            self.restore_adapters(peak)
        started = time.time()
        with torch.random.fork_rng(devices=[self.dist.device] if self.dist.device.type == "cuda" else []):
            torch.manual_seed(derive(cfg.cell.seed, Stream.TEST))
            episodes = self.rollout(self.dist.shard(problems), cfg.train.val_n, cfg.sampling.val_temperature)
        episodes, _ = self.dist.gather(episodes)
        if not main:
            return
        metrics = validation_metrics(episodes, self.task, self.workflow, cfg.workflow, split="test")
        self.run_dir.write_record(outcome_record("test", peak, episodes))
        self.metrics.write({"step": peak, "split": "test", **metrics, "time/test_s": time.time() - started})
        self.run_dir.record(cellstate.progressed(peak_test_acc=metrics["test/acc"]))
        log.info("test at the peak (step %d): acc %.3f on %d problems (val %.3f)", peak, metrics["test/acc"],
                 len(problems), self.val_acc[peak])

    def tested(self, step: int) -> bool:
        """Whether metrics.jsonl holds the test row of `step` (a resume after it was written)."""
        return any(row["split"] == "test" and row["step"] == step for row in self.run_dir.read_metrics())

    def restorable(self, step: int) -> bool:
        """Whether the adapters of `step` can be had: its checkpoint (the peak's is kept) or the
        start; a peak checkpoint deleted by hand skips the test evaluation, saying so."""
        if not self.routing.trainable or step == 0 or step in dict(self.run_dir.complete_checkpoints()):
            return True
        log.warning("the peak's checkpoint (step %d) is not on disk: no test evaluation", step)
        return False

    def restore_adapters(self, step: int) -> None:
        """The trained adapters as they were at `step`, served: its checkpoint's, or at step 0
        the initial ones, which are the base model (LoRA's B starts at zero)."""
        if step == 0:
            with torch.no_grad():
                for name in self.routing.trainable:
                    for key, param in adapter_parameters(self.model, name).items():
                        if ".lora_B." in key:
                            param.zero_()
        else:
            checkpoint.load_adapters(self.run_dir.checkpoint(step), self.model, self.routing.trainable)
        self.refresh_engine(step)

    def summarise(self, step: int, metrics: dict[str, float]) -> None:
        """Accuracy summary and the alerts into state.json, so `gridrun status` reads one file."""
        fields: dict[str, Any] = {"last_val_acc": metrics["val/acc"], **self.peak_fields()}
        if step == 0:
            fields["first_val"] = {k: v for k, v in metrics.items() if k.startswith(VAL_ROLE)}
        else:
            fields["alerts"] = self.alerts()
        self.run_dir.record(cellstate.progressed(**fields))

    def log_row(self, row: dict[str, Any]) -> None:
        """Write a metrics row (a train row with its `alert/<mechanism>` flags); the mechanism
        alerts and the validation accuracies see it first."""
        self.mechanism_alerts = self.watch.see(row)
        self.val_acc.update(val_accuracy([row]))
        self.metrics.write({**row, **alert_flags(self.mechanism_alerts, self.watch.flagged)}
                           if row["split"] == "train" else row)

    def peak_step(self) -> int | None:
        """The step of the best validation so far (ties: the earliest), as Table 1's peak."""
        peak = first_peak(self.val_acc)
        return None if peak is None else peak[0]

    def peak_fields(self) -> dict[str, Any]:
        """state.json's copy of the peak, derived from the rows metrics.jsonl holds as
        `gridrun collect` derives it (so a resume that replays validations cannot leave a
        peak that the metrics no longer hold)."""
        peak = first_peak(self.val_acc)
        return {} if peak is None else {"peak_step": peak[0], "peak_val_acc": peak[1]}

    # --- checkpoints ----------------------------------------------------------------------
    def save(self, step: int) -> None:
        if not self.dist.is_main:
            return
        state = {
            "step": step,
            "sampler": self.sampler.state(),
            "update_rng": self.update_rng.getstate(),
            "skipped_nonfinite": self.skipped_nonfinite,
            "coherence": self.coherence.state_dict() if self.coherence else None,
            "python_rng": random.getstate(),
            "torch_rng": torch.get_rng_state(),
            # This rank's own GPU only: another layout (one GPU per task) or the CPU resumes it.
            "cuda_rng": torch.cuda.get_rng_state(self.dist.device) if self.dist.device.type == "cuda" else None,
        }
        peak = self.peak_step()
        checkpoint.save(
            self.run_dir, step, self.model, self.routing.trainable, self.optimizers, state, self.config.train.keep_checkpoints,
            roles=self.routing.role_adapter, protect=frozenset() if peak is None else frozenset({peak}),
        )

    def resume(self) -> int:
        latest = self.run_dir.latest_checkpoint()
        if latest is None:
            # Rows of an attempt that died before its first checkpoint are replayed; rows no
            # checkpoint matches any more (all moved aside) are kept beside, never lost.
            if self.dist.is_main:
                kept_aside = self.run_dir.set_metrics_aside()
                if kept_aside is not None:
                    log.warning("no checkpoint left: restarting from step 0, earlier metrics kept in %s", kept_aside)
            return 0
        step, path = latest
        saved = checkpoint.load(path, self.model, self.routing.trainable, self.optimizers)
        self.sampler.restore(saved["sampler"])
        self.update_rng.setstate(saved["update_rng"])
        self.skipped_nonfinite = saved.get("skipped_nonfinite", 0)
        if self.coherence is not None and saved.get("coherence") is not None:
            self.coherence.load_state_dict(saved["coherence"], self.dist.device)
        random.setstate(saved["python_rng"])
        torch.set_rng_state(saved["torch_rng"])
        restore_cuda_rng(saved.get("cuda_rng"), self.dist.device)
        self.dist.decorrelate_rng(self.config.cell.seed, step)
        if self.dist.is_main:
            # Training on past the test row's step replaces it (the peak may move): drop it.
            dropped = ("test",) if step < self.total_steps else ()
            kept = self.run_dir.truncate_metrics(step, dropped)
            self.run_dir.drop_records_after(step, dropped)
            for row in kept:
                self.mechanism_alerts = self.watch.see(row)
            self.val_acc = val_accuracy(kept)
            self.val_se = {r["step"]: r["val/acc_se"] for r in kept if r["split"] == "val" and "val/acc_se" in r}
            self.val_records = self.run_dir.read_records("val")[0]
            # The detector replays the validations kept (a stop acted before the resume is in state.json).
            self.detect_fall()
            self.run_dir.record(cellstate.progressed(**self.peak_fields()))
        log.info("resumed from %s", path)
        return step


def outcome_record(split: str, step: int, episodes: list[Episode]) -> ValidationRecord:
    """An evaluation's per-problem record: each answer's problem and whether it was right."""
    return ValidationRecord.from_outcomes(split, step, ((e.problem.id, e.scored.correct) for e in episodes))


def restore_cuda_rng(saved: Any, device: torch.device) -> None:
    """Set `device`'s CUDA RNG from a checkpoint's: one state (this rank's GPU), or the list
    of checkpoints written before one GPU per task (one per visible GPU; rank 0's was the
    first). Resuming on the CPU has no CUDA RNG to set."""
    if saved is None or device.type != "cuda":
        return
    torch.cuda.set_rng_state(saved[0] if isinstance(saved, (list, tuple)) else saved, device)
