#!/usr/bin/env bash
# Thirteenth session, run 2: the job of jobs/s13run2.env.
source jobs/s13run2.env
bash scripts/gpu_job.sh
