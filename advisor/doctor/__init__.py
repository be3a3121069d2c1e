"""`advisor doctor`: what this machine gives the advisor, each line checked for real (checks), and the
command that runs the checks and reports them (command)."""
