# The workspace of lab-launch-serve.yaml: `provision job create` uploads this directory as the job's model,
# and the job runs in it (/opt/ml/models), as Launch runs a job in its workspace.
echo "serving from $(pwd) on port $RIGBASE_PORT"
