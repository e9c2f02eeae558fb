#!/usr/bin/env bash
# Sixteenth session, run 3: the job of jobs/s16run3.env.
source jobs/s16run3.env
bash scripts/gpu_job.sh
