"""Record files: TFRecord read and written natively, tf.train.Example parsed without
TensorFlow, ArrayRecord through `array_record`."""
