#!/usr/bin/env bash
# Fifteenth session, run 3: the job of jobs/s15run3.env.
source jobs/s15run3.env
bash scripts/gpu_job.sh
