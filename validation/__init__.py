"""validation: running plans for real against their predictions, and the work around it.

- `validation.validate.run_validate(ValidateConfig)`: the sweep of `picasso validate`
  (plans from planner.builders, runs through executor.process.launch, predictions through
  planner.search.evaluate, the refit on the fit plans' timelines in validation.refit)
- `validation.calibrate.calibrate(CalibrateConfig)`: `picasso calibrate`'s microbenchmarks
  (executor.measure.microbench) fitted into a hardware spec (simulator.calibration)
- `validation.demo.run_demo(DemoConfig)`: `picasso demo`, every stage end to end
Reports are written with simulator.report. This layer sits above executor and planner;
only picasso/ imports it.
"""
