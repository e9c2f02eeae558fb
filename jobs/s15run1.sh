#!/usr/bin/env bash
# Fifteenth session, run 1: the job of jobs/s15run1.env.
source jobs/s15run1.env
bash scripts/gpu_job.sh
