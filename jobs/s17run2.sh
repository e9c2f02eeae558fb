#!/usr/bin/env bash
# Seventeenth session, run 2: the job of jobs/s17run2.env.
source jobs/s17run2.env
bash scripts/gpu_job.sh
