"""The `tools/call` pipeline: context, classification hand-off, admission, side effects (claim,
forward, record), attempts and stored outcomes."""
