"""What ties the wings together: the command-line tools, the demo, `deploy_split`. Nothing imports it."""
