#!/usr/bin/env bash
# Fourteenth session, run 1: the job of jobs/s14run1.env.
source jobs/s14run1.env
bash scripts/gpu_job.sh
