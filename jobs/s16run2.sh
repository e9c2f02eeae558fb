#!/usr/bin/env bash
# Sixteenth session, run 2: the job of jobs/s16run2.env.
source jobs/s16run2.env
bash scripts/gpu_job.sh
