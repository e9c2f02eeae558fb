#!/usr/bin/env bash
# Thirteenth session, run 3: the job of jobs/s13run3.env.
source jobs/s13run3.env
bash scripts/gpu_job.sh
