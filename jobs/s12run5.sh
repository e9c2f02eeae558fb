#!/usr/bin/env bash
# Twelfth session, run 5: the job of jobs/s12run5.env.
source jobs/s12run5.env
bash scripts/gpu_job.sh
