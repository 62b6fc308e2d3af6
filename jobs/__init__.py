"""The jobs that drive the stages: the nightly batch (`jobs.nightly`) and the main demo
(`jobs.demo`). They sit on the floor above training, synthesis and analysis."""
