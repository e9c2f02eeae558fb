#!/usr/bin/env bash
# Seventeenth session, run 3: the job of jobs/s17run3.env.
source jobs/s17run3.env
bash scripts/gpu_job.sh
