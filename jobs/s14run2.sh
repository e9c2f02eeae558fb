#!/usr/bin/env bash
# Fourteenth session, run 2: the job of jobs/s14run2.env.
source jobs/s14run2.env
bash scripts/gpu_job.sh
