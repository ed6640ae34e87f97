"""branch-manager: repositories, branches, tags, object reads and writes on refs."""
