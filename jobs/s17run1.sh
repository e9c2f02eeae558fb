#!/usr/bin/env bash
# Seventeenth session, run 1: the job of jobs/s17run1.env.
source jobs/s17run1.env
bash scripts/gpu_job.sh
