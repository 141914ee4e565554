"""Pure logic: specs, plans, schedules, planners, partitions, data order, students, diagnosis; no process is started."""
