"""Actions: hooks that gate commits and merges, lakeFS-style (docs/actions.md).

* quarry.actions.files: action files (`_quarry_actions/*.yaml`, `_lakefs_actions/*.yaml`):
  parse, validate, match an event;
* quarry.actions.webhook: the webhook hook: the URL guard, the signed POST;
* quarry.actions.runs: running the hooks of an event and recording the run in KV.
"""
