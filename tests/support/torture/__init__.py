"""The torture suite's harness (docs/reliability.md): fault plans and the run of one seed
(harness), its workloads (ledgers, churn, disks, writer - a child process), the history
checker (history), the scheduler of seed processes (run) and the record of long runs
(record)."""
