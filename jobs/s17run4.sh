#!/usr/bin/env bash
# Seventeenth session, run 4: the job of jobs/s17run4.env.
source jobs/s17run4.env
bash scripts/gpu_job.sh
