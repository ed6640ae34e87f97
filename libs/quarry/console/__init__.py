"""The web console (`quarry serve console`): server-rendered pages over branch-manager and
committer, every call made with the signed-in user's own token (docs/console.md)."""
