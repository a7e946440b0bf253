"""AWS implementations of the engine interfaces: DynamoDB job store, EventBridge bus."""
