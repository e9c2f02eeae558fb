#!/usr/bin/env bash
# Fifteenth session, run 4: the job of jobs/s15run4.env.
source jobs/s15run4.env
bash scripts/gpu_job.sh
