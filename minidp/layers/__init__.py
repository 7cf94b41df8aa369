"""Layers and models with PyTorch's names, weight layouts, initialisations and state_dict keys."""

from minidp.layers.basic import (
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
)
from minidp.layers.flat import FlatParameters, Parameter
from minidp.layers.init import manual_seed
from minidp.layers.models import MODELS, cifar_cnn, lenet5, mlp, model_for, resnet20
from minidp.layers.module import LayerInputError, Module

__all__ = [
    "AvgPool2d", "BatchNorm2d", "Conv2d", "Dropout", "FlatParameters", "Flatten",
    "LayerInputError", "Linear", "MODELS", "MaxPool2d", "Module", "Parameter", "ReLU",
    "Sequential", "cifar_cnn", "lenet5", "manual_seed", "mlp", "model_for", "resnet20",
]
