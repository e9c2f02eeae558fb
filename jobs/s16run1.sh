#!/usr/bin/env bash
# Sixteenth session, run 1: the job of jobs/s16run1.env.
source jobs/s16run1.env
bash scripts/gpu_job.sh
