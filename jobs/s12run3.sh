#!/usr/bin/env bash
# Twelfth session, run 3: the job of jobs/s12run3.env.
source jobs/s12run3.env
bash scripts/gpu_job.sh
