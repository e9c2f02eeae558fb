#!/usr/bin/env bash
# Nineteenth session, run 3: jobs/s19run3.env through gpu_job.sh.
source jobs/s19run3.env
bash scripts/gpu_job.sh
