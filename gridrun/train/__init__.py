"""The cell half: one cell's multi-agent GRPO loop. Never imports Hydra or gridrun.grid;
reads config.yaml and writes only inside its run directory. The process around it (lock,
state, signals, exit codes) is gridrun/cellrun.py.

    trainer.py      the loop (rollout -> reward -> advantages -> update -> log -> validate ->
                    checkpoint)
    rollout.py      stage-batched rollouts: episodes as coroutines, their LLM calls batched
    engines/        the rollout engines behind one interface: hf (transformers), vllm
    episode.py      what a rollout records: every turn of every role, the committed answer
    scoring.py      rewards computed while the rollout goes on
    credit.py       role-level credit (reward.credit): each turn's own reward; role/<r>/reward
    advantages.py   the reward control's shuffle, GRPO's rows and groups, named estimators
    ppo.py          pure PPO-side maths: clipped loss, KL, ratio diagnostics, aggregation
    losses.py       the named policy losses (grpo.policy_loss) over ppo.py's maths
    minibatches.py  the order rows are cut into mini-batches
    lr_schedule.py  the LR schedule (warmup, constant or cosine, its advances) and the role
                    LR ramp
    update.py       the policy update of a step: per adapter, mini-batches, per-role metrics
    logprobs.py     per-token log-probs and entropies; padding.py: ragged rows to tensors
    cpu/            the CPU-only fast paths behind one door (`cpu.applies`): grouped and
                    packed attention, packed rows, fused LoRA layers, the lean Qwen3 decoder
    policy.py       peft's side of policy routing: adapters attached, activated, frozen ones
                    resolved (the role -> adapter map is gridrun/seam/routing.py)
    coherence.py    I6, the gradient-direction coherence regularizer
    diagnostics.py  trajectory-side drift signatures; validate.py: validation metrics
    sampler.py      the order train problems are drawn in
    seeds.py        every derived seed, by named stream
    checkpoint.py   adapters, optimizers, RNG states and data position, atomically
    metrics_log.py  metrics.jsonl and offline wandb
    distributed.py  data parallelism over a job's ranks (Dist)
    model.py        the base model and tokenizer; random_init.py: random Qwen3 weights;
                    precision.py: which dtypes this CPU computes natively
"""
