"""The soak (`pipebd soak`): a real service driven for minutes by a seeded random mix of jobs, user actions and
faults, every action and observation kept in a history (history.py), and invariants checked on that history at
the end (invariants.py). driver.py runs it; record.py writes its result document."""
