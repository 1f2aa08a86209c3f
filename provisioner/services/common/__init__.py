"""What every domain of the rules uses: the audit trail, the lifecycle transitions, the error types, names,
the runtime (settings and provider drivers), wake-ups after commit, the desired-state plumbing, backups."""
