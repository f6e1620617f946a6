"""Data stage: ``sysbench-gpu data download|stats|validate`` for any registered benchmark."""
