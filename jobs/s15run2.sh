#!/usr/bin/env bash
# Fifteenth session, run 2: the job of jobs/s15run2.env.
source jobs/s15run2.env
bash scripts/gpu_job.sh
