#!/usr/bin/env bash
# Eighteenth session, run 1: the job of jobs/s18run1.env.
source jobs/s18run1.env
bash scripts/gpu_job.sh
