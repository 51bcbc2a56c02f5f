"""Launches the frt robot host as a ROS 2 node.

    ros2 launch frt_robot_host robot_host.launch.py config:=/path/to/pi05_thor.yaml

Arguments: config (the node's YAML configuration), namespace, use_sim_time, log_level,
autostart (true: configure and activate at start; false: a managed node waiting for
`ros2 lifecycle set <node> configure` and `activate`),
respawn (restart the node when it exits), transport (`rcl`: the r2r transport of a build with
the `ros2` feature; `dds`: the pure-Rust DDS transport of a build with the `dds` feature).
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    default_config = PathJoinSubstitution(
        [FindPackageShare("frt_robot_host"), "config", "pi05_thor.yaml"]
    )
    args = [
        DeclareLaunchArgument("config", default_value=default_config,
                              description="robot host configuration (YAML)"),
        DeclareLaunchArgument("namespace", default_value="",
                              description="namespace of the node and its ~/ topics"),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="follow /clock instead of the system clock"),
        DeclareLaunchArgument("log_level", default_value="info",
                              description="rcl log level"),
        DeclareLaunchArgument("autostart", default_value="true",
                              description="configure and activate the managed node at start"),
        DeclareLaunchArgument("respawn", default_value="false",
                              description="restart the node when it exits"),
        DeclareLaunchArgument("transport", default_value="rcl", choices=["rcl", "dds"],
                              description="rcl (r2r) or dds (pure Rust)"),
    ]
    transport_flag = PythonExpression(
        ["'--dds' if '", LaunchConfiguration("transport"), "' == 'dds' else ''"])
    node = Node(
        package="frt_robot_host",
        executable="frt-robot-host",
        name="frt_robot_host",
        namespace=LaunchConfiguration("namespace"),
        arguments=["ros", transport_flag,
                   "--ros-args", "--log-level", LaunchConfiguration("log_level")],
        parameters=[{
            "config": LaunchConfiguration("config"),
            "use_sim_time": LaunchConfiguration("use_sim_time"),
            "autostart": LaunchConfiguration("autostart"),
        }],
        respawn=LaunchConfiguration("respawn"),
        respawn_delay=2.0,
        output="screen",
        emulate_tty=True,
    )
    return LaunchDescription(args + [node])
