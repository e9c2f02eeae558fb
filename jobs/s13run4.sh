#!/usr/bin/env bash
# Thirteenth session, run 4: the job of jobs/s13run4.env.
source jobs/s13run4.env
bash scripts/gpu_job.sh
