#!/usr/bin/env bash
# Thirteenth session, run 1: the job of jobs/s13run1.env.
source jobs/s13run1.env
bash scripts/gpu_job.sh
