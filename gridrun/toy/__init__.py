"""The embedded toy world: a tiny Qwen3 warm-started on synthetic arithmetic transcripts.

    build.py        build once and cache: tokenizer, model, supervised warm start (uses train/)
    transcripts.py  the synthetic supervised transcripts of every role of every workflow
    world/          the shipped world: model, tokenizer and the record of its build

The trainer never imports this package: gridrun/cellrun.py resolves `model.name_or_path: toy`
to the built world's directory.
"""
