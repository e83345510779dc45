"""One thin command-line entry point per job (`python -m scripts.NAME -h`); the work lives in the packages.

prepare, train, sample, evaluate, attention, plot, convert, serve, ablate  the jobs
bench_*, gpu_check                                                       benchmarks and the GPU check
cli, inference_args                                                      the argparse glue they share
"""
